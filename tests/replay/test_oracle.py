"""The oracle under K_max and the score-ranked reference: a hand-built trace worked by hand, and
oracle >= ranked, oracle >= every policy."""

from __future__ import annotations

import pytest
import torch

from sglang_echo.core.baselines import Chain
from sglang_echo.core.factory import POLICIES, PolicyConfig, make_policy
from sglang_echo.replay.oracle import RankedReference, oracle_accepted
from sglang_echo.replay.simulate import replay_offline, replay_serving
from sglang_echo.replay.trace import Trace, TraceMeta

OUT = [10, 11, 12, 13, 14, 15, 16, 17]
# BFS trees (token, parent, logprob); children contiguous and best first. True continuation in caps.
TREES = [
    [(10, -1, 0.0), (11, 0, -0.1), (20, 0, -1.0), (12, 1, -0.2), (22, 1, -0.9), (13, 3, -0.3)],  # a = 3
    [(11, -1, 0.0), (30, 0, -0.1), (12, 0, -0.5), (31, 1, -0.1)],  # a = 1 (12 is the second child)
    [(12, -1, 0.0), (40, 0, -0.1)],  # a = 0
]
DEPTH = 3


def hand_trace() -> Trace:
    tok, par, dep, lp, fc, nk, na, node_ptr = [], [], [], [], [], [], [], [0]
    for tree in TREES:
        depth = []
        for i, (t, p, l) in enumerate(tree):
            depth.append(0 if p < 0 else depth[p] + 1)
            kids = [j for j, (_, q, _) in enumerate(tree) if q == i]
            tok.append(t), par.append(p), dep.append(depth[-1]), lp.append(l)
            fc.append(kids[0] if kids else -1), nk.append(len(kids))
            na.append(-1 if depth[-1] == DEPTH else len(kids))  # leaves above DEPTH: expanded, childless
        node_ptr.append(node_ptr[-1] + len(tree))
    T = lambda x: torch.tensor(x, dtype=torch.int64)
    meta = TraceMeta(drafter="hand", target="-", max_new=4, depth=DEPTH, width=2, beams=[1, 2], max_nodes=8)
    return Trace(
        meta,
        prompt_indptr=T([0, 2]),
        prompt_tokens=T([1, 2]),
        output_indptr=T([0, len(OUT)]),
        output_tokens=T(OUT),
        tree_indptr=T([0, 3]),
        node_indptr=T(node_ptr),
        token=T(tok),
        parent=T(par),
        depth=T(dep),
        logprob=torch.tensor(lp),
        first_child=T(fc),
        n_kept=T(nk),
        n_avail=T(na),
    )


def test_true_paths_and_oracle_by_hand():
    tr = hand_trace()
    tr.check()
    a = tr.true_path_length()
    assert a.tolist() == [3, 1, 0]
    on = torch.ones(3, dtype=torch.bool)
    # Three requests at these trees: 3 roots + sum a = 4 true-path nodes.
    assert oracle_accepted(a, on, budget=100, max_depth=8) == 4
    assert oracle_accepted(a, on, budget=5, max_depth=8) == 2  # 5 slots - 3 roots
    assert oracle_accepted(a, on, budget=2, max_depth=8) == 0  # not even the roots fit: plain decoding
    assert oracle_accepted(a, on, budget=100, max_depth=2) == 3  # a capped at depth 2: 2 + 1 + 0
    assert oracle_accepted(a, torch.tensor([False, True, True]), budget=100, max_depth=8) == 1


def test_ranked_reference_by_hand():
    tr = hand_trace()
    # Drafted nodes by path score (tree, node, S, on the true path): (0,1,-0.1,+) (1,1,-0.1,-)
    # (2,1,-0.1,-) (1,3,-0.2,-) (0,3,-0.3,+) (1,2,-0.5,+) (0,5,-0.6,+) (0,2,-1.0,-) (0,4,-1.0,-);
    # ties go to the earlier row, as to a parent before its child.
    ref, rows = RankedReference(tr, max_depth=3), torch.tensor([0, 1, 2])
    assert [ref.accepted(rows, 3 + n) for n in (0, 1, 3, 5, 6, 7, 9)] == [0, 1, 1, 2, 3, 4, 4]
    assert ref.accepted(rows, 2) == 0  # not even the roots fit
    assert RankedReference(tr, max_depth=2).accepted(rows, 100) == 3  # node (0,5) is at depth 3
    assert ref.accepted(torch.tensor([-1, 1, 2]), 3 + 6) == 1  # an inactive row: its root only
    assert tr.path_scores[[3, 5, 9]].tolist() == pytest.approx([-0.3, -0.6, -0.2])


def test_replay_by_hand():
    tr = hand_trace()
    # Chain of depth 3 at o_0 drafts 11, 12, 13: all accepted, bonus o_4; the stream (4 tokens) ends.
    res = replay_offline(tr, Chain(3), [0], k_max=100)
    assert [a.tolist() for a in res.accept_len] == [[3]] and res.committed == [3] and res.oracle_kmax == [3]
    # Budgeted chain with K_max 3: root + 2 drafts -> accepts 11, 12; next root o_3 has no tree left.
    res = replay_offline(tr, make_policy("budgeted-chain", PolicyConfig(k_max=3, max_depth=3)), [0], k_max=3)
    assert [a.tolist() for a in res.accept_len] == [[2]] and res.oracle_kmax == [2]
    assert res.summary()["oracle_fraction"] == 1.0
    # Chain of depth 1: 11 (accept 1) -> root o_2 = 12: drafts 40, rejected -> root o_3 ends the stream.
    res = replay_offline(tr, Chain(1), [0], k_max=100)
    assert [a.tolist() for a in res.accept_len] == [[1], [0]] and res.oracle_kmax == [1, 0]
    assert res.summary()["oracle_fraction"] == 1.0 and res.mat == 1.5
    # A chain deeper than the recording asks to expand 13 (never expanded): one coverage miss.
    res = replay_offline(tr, Chain(4), [0], k_max=100)
    assert res.coverage.unexpanded == 1 and res.coverage.missed == 1 and res.accept_len[0].tolist() == [3]


@pytest.mark.parametrize("B", [1, 4, 12])
@pytest.mark.parametrize("k_per_req", [1.5, 4])
def test_oracle_bounds_every_policy(B, k_per_req, hash_trace):
    k_max = int(B * k_per_req)
    cfg = PolicyConfig(k_max=k_max, max_depth=5, w_def=1, w_max=3, topk=3, total_tokens=10)
    for name in POLICIES:
        policy = make_policy(name, cfg)
        res = replay_serving(hash_trace, policy, B, k_max=k_max, min_steps=6, min_tokens=0)
        for acc, om, ok, rk, ver in zip(
            res.accept_len, res.oracle_matched, res.oracle_kmax, res.ranked_kmax, res.verified_total
        ):
            assert int(acc.sum()) <= om  # with the policy's own verified tokens as the budget
            assert rk <= ok
            if policy.budgeted:
                assert ver <= max(k_max, B) and int(acc.sum()) <= ok
        s = res.summary()
        assert s["oracle_matched_fraction"] <= 1.0
        if policy.budgeted:
            assert s["oracle_fraction"] <= 1.0
