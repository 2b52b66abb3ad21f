"""Simulated acceptance's pieces on a recorded trace (integration/simulate.py), without a server:
the stream lookup, the candidate overlay over a drafter that still runs, and the logits override,
together equal to the trace replay step for step."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from sglang_echo.core.factory import make_policy
from sglang_echo.core.policy import build_trees
from sglang_echo.core.tree import Candidates
from sglang_echo.core.verify import greedy_verify
from sglang_echo.integration.simulate import (
    FORCED_LOGIT,
    STREAM_ATTR,
    SimulatedFrontierDrafter,
    TraceStreams,
    force_tokens,
)
from sglang_echo.replay.drafter import RecordedDrafter

from .conftest import CFG


class JunkDrafter:
    """Stands in for the EAGLE-3 frontier drafter: counts its forwards, keeps what it was asked to
    expand, and proposes tokens the trace never holds (so any leak into the trees shows)."""

    def __init__(self, topk: int):
        self.topk, self.forwards, self.calls = topk, 0, []

    def propose(self, frontier, k):
        B, F = frontier.slots.shape
        self.forwards += frontier.depth > 0
        self.calls.append((frontier.depth, k, frontier.tokens.clone(), frontier.valid.clone()))
        return Candidates(
            tokens=torch.full((B, F * k), 7),
            logprob=torch.zeros(B, F * k),
            parent=torch.arange(F).repeat_interleave(k).expand(B, F * k).contiguous(),
            valid=torch.ones(B, F * k, dtype=torch.bool),
        )


def _rows(trace, picks):
    """Server-side view of requests at (stream, position s): seq_len = prompt_len + s, root o_s."""
    p = torch.tensor([q for q, _ in picks])
    s = torch.tensor([x for _, x in picks])
    plen = trace.prompt_indptr[p + 1] - trace.prompt_indptr[p]
    roots = trace.output_tokens[trace.output_indptr[p] + s]
    return p, s, plen + s, roots


def _replay_step(trace, policy, p, s, roots):
    """The replay's rule (replay/simulate.py): recorded drafts, argmax at depth d below o_s = o_{s+d+1}."""
    rec = RecordedDrafter(trace)
    rec.seek(trace.tree_indptr[p] + s)
    trees, _ = build_trees(policy, rec, roots)
    req = trees.request_of_node
    pred = trace.output_tokens[trace.output_indptr[p][req] + s[req] + trees.depth + 1]
    return trees, greedy_verify(trees, pred)


def test_stream_lookup_is_by_prompt_ids_and_cached(hash_trace):
    st = TraceStreams.from_trace(hash_trace)
    reqs = [SimpleNamespace(rid=str(p), origin_input_ids=hash_trace.prompt(p).tolist()) for p in (2, 0, 5)]
    stranger = SimpleNamespace(rid="x", origin_input_ids=hash_trace.prompt(1).tolist()[:-1])
    assert st.streams(reqs + [stranger]).tolist() == [2, 0, 5, -1]
    assert [getattr(r, STREAM_ATTR) for r in reqs + [stranger]] == [2, 0, 5, -1]
    reqs[0].origin_input_ids = []  # the cached stream is used, the ids are not looked up again
    assert st.stream_of(reqs[0]) == 2


def test_next_tokens_are_the_recorded_continuation_only(hash_trace):
    st = TraceStreams.from_trace(hash_trace)
    p = 3
    plen, out = hash_trace.prompt(p).numel(), hash_trace.output(p)
    pos = torch.tensor([[plen - 2, plen - 1, plen, plen + 4, plen + out.numel() - 2, plen + out.numel() - 1]])
    got = st.next_tokens(torch.tensor([p]), pos)[0].tolist()
    # Inside the prompt: nothing; then o_0, o_1, o_5, the last recorded token; past it: nothing.
    assert got == [-1, int(out[0]), int(out[1]), int(out[5]), int(out[-1]), -1]
    assert st.next_tokens(torch.tensor([-1]), pos)[0].tolist() == [-1] * 6


def test_trees_need_a_recorded_position_and_the_recorded_root(hash_trace):
    st = TraceStreams.from_trace(hash_trace)
    p, s, seq_lens, roots = _rows(hash_trace, [(0, 0), (1, 3), (4, hash_trace.num_positions(4) - 1), (2, 2)])
    want = (hash_trace.tree_indptr[p] + s).tolist()
    streams = p.clone()
    assert st.trees(streams, seq_lens, roots).tolist() == want
    wrong = roots.clone()
    wrong[3] += 1  # a stream that left the trace drafts nothing
    past = seq_lens.clone()
    past[2] += 1  # past the last recorded tree
    streams[1] = -1
    assert st.trees(streams, past, wrong).tolist() == [want[0], -1, -1, -1]


def test_force_tokens_touches_one_value_per_forced_row():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g) * 30
    before = logits.clone()
    want = torch.tensor([3, -1, 49, 0, -1, 17])
    force_tokens(logits, want)
    rows = want >= 0
    assert torch.equal(logits.argmax(-1)[rows], want[rows])
    changed = (logits != before).nonzero().tolist()
    assert changed == [[0, 3], [2, 49], [3, 0], [5, 17]]
    assert float(logits[0, 3]) == FORCED_LOGIT
    assert torch.equal(logits[~rows], before[~rows])


# ECHO's gates at the paper's thresholds stop the hash drafter (confidences about 0.1) at depth 1;
# the fixed-threshold ablation with a low tau drafts deep through the same elastic scheduler.
POLICIES = {"echo": CFG, "fixed-threshold": replace(CFG, fixed_tau=0.05), "static-tree": CFG, "budgeted-chain": CFG}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_simulated_step_equals_the_replay(name, hash_trace):
    """A batch of requests at recorded positions: the overlay's trees are the recorded drafter's
    (the running drafter's own proposals never reach them), its frontiers are what the running
    drafter expands, and the target with forced logits accepts exactly what the replay accepts."""
    policy = make_policy(name, POLICIES[name])
    picks = [(0, 0), (1, 9), (2, 4), (3, 1)]  # 4 roots under CFG's K_max 20: room to draft deep
    p, s, seq_lens, roots = _rows(hash_trace, picks)
    st = TraceStreams.from_trace(hash_trace)
    junk = JunkDrafter(topk=8)
    sim = SimulatedFrontierDrafter(junk, RecordedDrafter(hash_trace, track=False), st.trees(p, seq_lens, roots))
    trees, _ = build_trees(policy, sim, roots)
    ref_trees, ref = _replay_step(hash_trace, policy, p, s, roots)
    for f in ("indptr", "tokens", "parents", "depth"):
        assert torch.equal(getattr(trees, f), getattr(ref_trees, f)), f
    assert trees.num_nodes > len(picks)  # something was drafted
    deep = [c for c in junk.calls if c[0] > 0]
    assert junk.forwards == len(deep) and sim.forwards == junk.forwards and (deep or name == "echo")
    assert all(int(tok[valid].ne(7).sum()) == int(valid.sum()) for _, _, tok, valid in deep)  # trace tokens
    # The target: random logits, then the trace's token forced at every node (position seq_len + depth).
    req = trees.request_of_node
    logits = torch.randn(trees.num_nodes, int(hash_trace.vocab_needed()))
    force_tokens(logits, st.next_tokens(p[req], seq_lens[req] + trees.depth))
    got = greedy_verify(trees, logits)
    assert torch.equal(got.accept_len, ref.accept_len) and torch.equal(got.bonus, ref.bonus)
    assert int(ref.accept_len.sum()) > 0
    # Without the override the same random target accepts (almost) nothing: the override matters.
    assert int(greedy_verify(trees, torch.randn_like(logits)).accept_len.sum()) < int(ref.accept_len.sum())


def test_overlay_asks_the_running_drafter_for_at_most_its_topk(hash_trace):
    p, s, seq_lens, roots = _rows(hash_trace, [(0, 1), (1, 1)])
    st = TraceStreams.from_trace(hash_trace)
    junk = JunkDrafter(topk=2)
    sim = SimulatedFrontierDrafter(junk, RecordedDrafter(hash_trace, track=False), st.trees(p, seq_lens, roots))
    build_trees(make_policy("static-tree", CFG), sim, roots)  # topk 3 > the drafter's 2
    assert {k for _, k, *_ in junk.calls} == {2}
