"""ECHO's elastic scheduler and the baselines: invariants over random batches, and the paper's cases."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_echo.core import (
    POLICIES,
    Candidates,
    ElasticConfig,
    ElasticPolicy,
    GatingConfig,
    PolicyConfig,
    StaticTree,
    build_trees,
    greedy_verify,
    make_policy,
)
from sglang_echo.core.synthetic import SyntheticDrafter, SyntheticWorld

from .trees import assert_well_formed

BUDGETED = ("echo", "dense-gating", "fixed-threshold", "budgeted-chain")


@settings(max_examples=60, deadline=None)
@given(
    policy=st.sampled_from(POLICIES),
    batch=st.integers(1, 24),
    k_per_req=st.floats(0.5, 12),
    max_depth=st.integers(1, 8),
    w_def=st.integers(1, 3),
    extra_w=st.integers(0, 4),
    taus=st.lists(st.floats(0, 1), min_size=3, max_size=3),
    seed=st.integers(0, 10**6),
)
def test_policy_invariants(policy, batch, k_per_req, max_depth, w_def, extra_w, taus, seed):
    k_max = max(1, int(batch * k_per_req))
    cfg = PolicyConfig(
        k_max=k_max, max_depth=max_depth, w_def=w_def, w_max=w_def + extra_w, topk=3, total_tokens=7, fixed_tau=taus[0]
    )
    gating = GatingConfig((1, 2, 4), tuple(taus))
    world = SyntheticWorld(batch, vocab=300, seed=seed)
    roots = torch.randint(0, 300, (batch,), generator=torch.Generator().manual_seed(seed))
    trees, state = build_trees(make_policy(policy, cfg, gating), SyntheticDrafter(world), roots)

    assert_well_formed(trees)
    assert trees.tokens[trees.indptr[:-1]].tolist() == roots.tolist(), "roots are the committed tokens"
    assert int(trees.depth.max()) <= max_depth
    if policy in BUDGETED:
        assert trees.num_nodes <= max(k_max, batch), "the verification cap (Eq. 4) is never exceeded"
    # Eq. 5: the stored path score is the sum of log-probs along the path.
    gp = trees.global_parents()
    parent_score = torch.where(gp >= 0, trees.path_score[gp.clamp(min=0)], torch.zeros_like(trees.path_score))
    assert torch.allclose(trees.path_score, parent_score + trees.logprob, atol=1e-5)
    # Verification of any policy's trees yields at least the bonus token.
    res = greedy_verify(trees, world.target_argmax(trees))
    assert (res.accept_len >= 0).all() and (res.accept_len <= trees.max_depth()).all()


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 16),
    k_per_req=st.floats(1, 10),
    max_depth=st.integers(1, 6),
    w_def=st.integers(1, 2),
    extra_w=st.integers(0, 4),
    taus=st.lists(st.floats(0, 0.9), min_size=2, max_size=2),
    seed=st.integers(0, 10**6),
)
def test_width_only_for_truncated_requests_and_only_when_none_can_deepen(
    batch, k_per_req, max_depth, w_def, extra_w, taus, seed
):
    cfg = ElasticConfig(max(1, int(batch * k_per_req)), max_depth, w_def, w_def + extra_w)
    policy = ElasticPolicy(cfg, GatingConfig((1, 3), tuple(taus)))
    world = SyntheticWorld(batch, vocab=300, seed=seed)
    trees, state = build_trees(policy, SyntheticDrafter(world), torch.zeros(batch, dtype=torch.int64))
    truncated = state.extra["truncated"]
    widened = state.extra.get("widened", torch.zeros(batch, dtype=torch.int64))
    assert not (widened[~truncated] > 0).any(), "Priority 2 widens truncated requests only"
    if (widened > 0).any():
        # Priority 2 ran, so no untruncated request could still deepen: each reached max depth.
        depth = trees.max_depth()
        assert (depth[~truncated] == max_depth).all()
    # Outside the truncation depth every request keeps at most W_def nodes per depth.
    for i in range(batch):
        lo, hi = int(trees.indptr[i]), int(trees.indptr[i + 1])
        per_depth = torch.bincount(trees.depth[lo:hi], minlength=max_depth + 1)[1:]
        deepest = int(trees.depth[lo:hi].max())
        if deepest:
            assert (per_depth[: deepest - 1] <= w_def).all()
            assert per_depth[deepest - 1] <= (cfg.w_max if truncated[i] else w_def)


class TableDrafter:
    """Request b proposes children whose top-1 probability at depth d is ``top1[b][d-1]``."""

    def __init__(self, top1: list[list[float]], width: int):
        self.top1, self.width = top1, width

    def propose(self, frontier, k):
        B, F = frontier.slots.shape
        d = frontier.depth + 1
        p = torch.tensor([row[d - 1] for row in self.top1])
        # Children: the top-1 with prob p, the rest share (1 - p) equally; tokens encode (d, rank).
        probs = torch.cat([p[:, None], ((1 - p) / (k - 1 if k > 1 else 1))[:, None].expand(B, k - 1)], 1)
        toks = (d * 100 + torch.arange(k)).expand(B, k)
        # Only the frontier's best node (column 0) is expanded with these scores; others are weaker.
        rank_penalty = torch.arange(F)[:, None].float() * 10.0
        logprob = probs.log()[:, None, :] - rank_penalty
        valid = frontier.valid[:, :, None].expand(B, F, k)
        return Candidates(
            tokens=toks[:, None, :].expand(B, F, k).reshape(B, F * k),
            logprob=logprob.reshape(B, F * k),
            parent=torch.arange(F)[None, :, None].expand(B, F, k).reshape(B, F * k),
            valid=valid.reshape(B, F * k),
        )


def tree_shape(trees, i):
    lo, hi = int(trees.indptr[i]), int(trees.indptr[i + 1])
    return torch.bincount(trees.depth[lo:hi], minlength=1).tolist()


def test_case1_low_load_truncate_and_widen():
    """B = 1, ample budget. Gates at d1 (tau .5) and d3 (tau .5); c_1 = .9 passes, c_3 = .9*.8*.3
    fails. Priority 1 builds the chain root-d1-d2, truncates at d3, then Priority 2 widens d3 to
    W_max = 4 inside the same request: nodes per depth [1, 1, 1, 4], 7 tokens (< K_max = 32)."""
    policy = ElasticPolicy(ElasticConfig(k_max=32, max_depth=6, w_def=1, w_max=4), GatingConfig((1, 3), (0.5, 0.5)))
    trees, state = build_trees(policy, TableDrafter([[0.9, 0.8, 0.3, 0.9, 0.9, 0.9]], 4), torch.tensor([7]))
    assert tree_shape(trees, 0) == [1, 1, 1, 4]
    assert state.extra["truncated"].tolist() == [True]
    assert state.extra["widened"].tolist() == [4]
    assert trees.num_nodes == 7


def test_case2_high_load_budget_moves_to_confident_requests():
    """B = 4, K_max = 10: 4 roots + 6 draft tokens. Requests 0 and 1 are confident everywhere,
    requests 2 and 3 fail the root gate (c_1 = .2 < .5). Priority 1 spends all 6 tokens on depth:
    requests 0 and 1 each get a chain of depth 3; nothing is left for Priority 2, so 2 and 3 verify
    only their roots. Trees: [1,1,1,1], [1,1,1,1], [1], [1]."""
    confident, unsure = [0.95] * 6, [0.2] * 6
    policy = ElasticPolicy(ElasticConfig(k_max=10, max_depth=6, w_def=1, w_max=4), GatingConfig((1, 3), (0.5, 0.3)))
    drafter = TableDrafter([confident, confident, unsure, unsure], 4)
    trees, state = build_trees(policy, drafter, torch.tensor([1, 2, 3, 4]))
    assert [tree_shape(trees, i) for i in range(4)] == [[1, 1, 1, 1], [1, 1, 1, 1], [1], [1]]
    assert state.extra["truncated"].tolist() == [False, False, True, True]
    assert trees.num_nodes == 10


def test_case2_with_spare_budget_widens_after_depth_is_exhausted():
    """Same batch with K_max = 20: the confident requests reach max depth 3 (6 tokens), leaving 10;
    only then Priority 2 widens the truncated requests at depth 1 by W_max = 4 each (8 tokens)."""
    confident, unsure = [0.95] * 3, [0.2] * 3
    policy = ElasticPolicy(ElasticConfig(k_max=20, max_depth=3, w_def=1, w_max=4), GatingConfig((1,), (0.5,)))
    drafter = TableDrafter([confident, confident, unsure, unsure], 4)
    trees, _ = build_trees(policy, drafter, torch.tensor([1, 2, 3, 4]))
    assert [tree_shape(trees, i) for i in range(4)] == [[1, 1, 1, 1], [1, 1, 1, 1], [1, 4], [1, 4]]


def test_w_def_narrows_to_the_budget_share():
    """W_def 2, depth 4, every request confident. K_max 33 over 8 requests leaves 25 drafts, a
    share of 0.78 per request and depth: width 1, so all 8 draft depths 1-3 (24 tokens) and the
    most confident one a fourth, where W_def 2 would give 8 requests two depth-1 siblings and only
    4-5 a second depth. K_max 64 (share 1.75) keeps W_def 2, and so does one request."""
    cfg = ElasticConfig(k_max=33, max_depth=4, w_def=2, w_max=4)
    policy = ElasticPolicy(cfg, GatingConfig((1,), (0.1,)))
    assert [policy.step_width(8, 33), policy.step_width(8, 64), policy.step_width(1, 33)] == [1, 2, 2]
    assert policy.step_width(40, 33) == 1  # no room at all: the grant is 0 anyway
    top1 = [[0.9 - 0.01 * b] * 4 for b in range(8)]
    trees, state = build_trees(policy, TableDrafter(top1, 4), torch.arange(8))
    assert state.extra["width"] == 1
    assert [tree_shape(trees, i) for i in range(8)] == [[1, 1, 1, 1, 1]] + [[1, 1, 1, 1]] * 7
    trees, state = build_trees(policy, TableDrafter(top1, 4), torch.arange(8), k_max=64)
    assert state.extra["width"] == 2 and tree_shape(trees, 0)[:3] == [1, 2, 2]


def test_budget_smaller_than_batch_degrades_to_plain_decoding():
    policy = ElasticPolicy(ElasticConfig(k_max=3, max_depth=4), GatingConfig.default())
    trees, _ = build_trees(policy, TableDrafter([[0.9] * 4] * 5, 4), torch.arange(5))
    assert trees.sizes.tolist() == [1] * 5


def test_static_tree_keeps_the_global_top_n():
    """EAGLE's re-rank: depth 2, topk 2, 4 tokens -> root + the 3 best of 2 + 4 candidates."""
    trees, _ = build_trees(StaticTree(2, 2, 4), TableDrafter([[0.7, 0.9]], 2), torch.tensor([0]))
    # d1: {.7, .3}; d2 under the .7 node: {.63, .07}; under .3 (penalised): tiny. Top 3: .7, .63, .3.
    assert sorted(trees.path_score.exp().tolist(), reverse=True)[1:] == pytest.approx([0.7, 0.63, 0.3], rel=1e-5)
