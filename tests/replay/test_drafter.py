"""RecordedDrafter serves exactly the live drafter's trees, and counts what it cannot serve."""

from __future__ import annotations

import pytest
import torch

from sglang_echo.core.factory import POLICIES, PolicyConfig, make_policy
from sglang_echo.core.policy import BuildState, TreePolicy
from sglang_echo.eval import speculative_generate
from sglang_echo.replay.drafter import RecordedDrafter, StreamDiverged

from .conftest import CFG, MAX_NEW, make_trace


class Capture(TreePolicy):
    """``policy`` unchanged, keeping every step's finished trees."""

    def __init__(self, policy: TreePolicy):
        self.inner, self.trees = policy, []
        self.name, self.max_depth = policy.name, policy.max_depth
        self.children_per_node, self.budgeted = policy.children_per_node, policy.budgeted

    def start(self, roots, k_max=None) -> BuildState:
        return self.inner.start(roots, k_max)

    def advance(self, state, cands) -> None:
        self.inner.advance(state, cands)

    def finish(self, state):
        trees = self.inner.finish(state)
        self.trees.append(trees)
        return trees


FIELDS = ("indptr", "tokens", "parents", "depth", "logprob", "path_score")


@pytest.mark.parametrize("name", [p for p in POLICIES if p != "ar"])
def test_recorded_trees_equal_live_trees(name, target, prompts, hash_drafter, hash_trace):
    policy = make_policy(name, CFG)
    live, rec = Capture(policy), Capture(policy)
    a = speculative_generate(target, hash_drafter, live, prompts[:4], MAX_NEW)
    drafter = RecordedDrafter(hash_trace)
    b = speculative_generate(target, drafter, rec, prompts[:4], MAX_NEW)
    assert a.tokens == b.tokens and len(live.trees) == len(rec.trees) > 0
    for s, (x, y) in enumerate(zip(live.trees, rec.trees)):
        for f in FIELDS:
            assert torch.equal(getattr(x, f), getattr(y, f)), (name, s, f)
    assert drafter.coverage.expansions > 0 and drafter.coverage.missed == 0 and drafter.coverage.fraction == 1.0


def test_coverage_counts_what_the_trace_lacks(target, prompts, hash_drafter):
    # A narrow, shallow recording: width 2, depth 2, beam 1, so wider/deeper requests miss.
    narrow = make_trace(target, hash_drafter, prompts[:2], depth=2, width=2, beams=(1,), max_nodes=64)
    cfg = PolicyConfig(k_max=20, max_depth=4, topk=3, total_tokens=10)
    drafter = RecordedDrafter(narrow)
    live = speculative_generate(target, hash_drafter, make_policy("static-tree", cfg), prompts[:2], MAX_NEW)
    res = speculative_generate(target, drafter, make_policy("static-tree", cfg), prompts[:2], MAX_NEW)
    assert res.tokens == live.tokens  # still lossless: missing drafts are just not drafted
    cov = drafter.coverage
    assert cov.missed > 0 and cov.unexpanded > 0 and cov.fraction < 1.0
    # k = 3 > width 2 where the drafter had 2 children: unknown, so counted as missed.
    assert cov.missed >= cov.unexpanded
    # A chain of depth 2 fits the recording exactly: full coverage.
    d2 = RecordedDrafter(narrow)
    speculative_generate(target, d2, make_policy("chain", PolicyConfig(max_depth=2)), prompts[:2], MAX_NEW)
    assert d2.coverage.missed == 0 and d2.coverage.fraction == 1.0


def test_node_cap_prunes_and_is_counted(target, prompts, hash_drafter):
    capped = make_trace(target, hash_drafter, prompts[:2], max_nodes=6)
    assert capped.meta.stats["pruned_nodes"] > 0
    assert int((capped.node_indptr[1:] - capped.node_indptr[:-1]).max()) <= 6
    drafter = RecordedDrafter(capped)
    speculative_generate(target, drafter, make_policy("static-tree", CFG), prompts[:2], MAX_NEW)
    assert drafter.coverage.missing_children > 0 and drafter.coverage.missed > 0


def test_diverged_stream_is_refused(hash_trace, prompts):
    d = RecordedDrafter(hash_trace)
    d.start([prompts[0]])
    first = int(hash_trace.output(0)[0])
    d.catch_up([torch.cat([prompts[0][1:], torch.tensor([first])])])
    wrong = (int(hash_trace.output(0)[1]) + 1) % 1000
    with pytest.raises(StreamDiverged):
        d.catch_up([torch.tensor([wrong])])
    with pytest.raises(KeyError):
        d.start([torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 9])])
