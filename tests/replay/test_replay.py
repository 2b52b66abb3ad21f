"""Replay == the offline engine, exactly, and the serving simulation's invariants."""

from __future__ import annotations

import json

import pytest
import torch

from sglang_echo.core.factory import POLICIES, make_policy
from sglang_echo.eval import HFTarget, speculative_generate
from sglang_echo.replay.drafter import RecordedDrafter
from sglang_echo.replay.simulate import replay_offline, replay_serving
from sglang_echo.replay.validate import validate

from .conftest import CFG, MAX_NEW, make_trace
from .test_drafter import Capture

ALL = {n: make_policy(n, CFG) for n in POLICIES}


def _assert_exact(rows):
    for r in rows:
        assert r["exact"], r
        assert r["live_committed"] == r["replay_committed"] > 0


def test_replay_equals_offline_loop_hash_drafter(target, prompts, hash_drafter, hash_trace):
    rows = validate(hash_trace, target, hash_drafter, ALL, list(range(len(prompts))), batch=4, k_max=CFG.k_max)
    _assert_exact(rows)
    # The drafter is good enough that the comparison covers long accepted paths and tight budgets.
    res = replay_offline(hash_trace, ALL["static-tree"], [0, 1, 2, 3], k_max=CFG.k_max)
    assert res.mat > 2.0


def test_replay_stops_streams_at_eos_like_the_loop(target, prompts, hash_drafter, hash_trace):
    eos = int(hash_trace.output(1)[5])  # pretend this token is eos: stream 1 ends early
    rows = validate(
        hash_trace,
        target,
        hash_drafter,
        {n: ALL[n] for n in ("echo", "chain")},
        [0, 1, 2],
        batch=3,
        k_max=CFG.k_max,
        eos_id=eos,
    )
    _assert_exact(rows)


def test_replay_equals_offline_loop_ngram(target, prompts):
    from sglang_echo.drafters.ngram import NGramDrafter

    # Repetitive prompts give the n-gram drafter something to find.
    reps = [torch.cat([p, p[:4], p]) for p in prompts[:4]]
    trace = make_trace(target, NGramDrafter(), reps, kind="ngram")
    assert trace.meta.stats["nodes"] > trace.num_trees
    _assert_exact(validate(trace, target, NGramDrafter(), ALL, [0, 1, 2, 3], batch=4, k_max=CFG.k_max))


def test_replay_equals_offline_loop_eagle3(tmp_path, tiny_llama_dir, prompts):
    """fp32 EAGLE-3 (an early-exit head, so drafts are accepted sometimes). The recording computes
    target features and draft forwards with other batch shapes than a live step; exactness here
    says rounding did not flip a top-k or a gate on this model."""
    from sglang_echo.bench.acceptance import build_drafter
    from sglang_echo.models.tiny import write_tiny_eagle3_draft

    V = json.loads((tiny_llama_dir / "config.json").read_text())["vocab_size"]
    head = write_tiny_eagle3_draft(
        tmp_path / "e3", tiny_llama_dir, init="early_exit", aux_layer_ids=[0, 0, 1], draft_vocab_size=V
    ).path
    t = HFTarget.from_pretrained(tiny_llama_dir, captured_layers=(1, 1, 2))
    drafter, captured = build_drafter("eagle3", head, t.model, t.device)
    assert captured == (1, 1, 2) and drafter.dtype == torch.float32
    trace = make_trace(t, drafter, prompts[:4], kind="eagle3")
    # Tree for tree, the replayed trees have the live structure; log-probs agree to rounding (the
    # recording's head forwards ran over other batch shapes).
    for name in ("static-tree", "echo"):
        live, rec = Capture(ALL[name]), Capture(ALL[name])
        speculative_generate(t, drafter, live, prompts[:4], MAX_NEW)
        speculative_generate(t, RecordedDrafter(trace), rec, prompts[:4], MAX_NEW)
        for x, y in zip(live.trees, rec.trees, strict=True):
            for f in ("indptr", "tokens", "parents", "depth"):
                assert torch.equal(getattr(x, f), getattr(y, f)), (name, f)
            torch.testing.assert_close(x.logprob, y.logprob, rtol=0, atol=1e-4)
    rows = validate(
        trace,
        t,
        drafter,
        {n: ALL[n] for n in ("chain", "static-tree", "echo", "budgeted-chain")},
        [0, 1, 2, 3],
        batch=4,
        k_max=CFG.k_max,
    )
    _assert_exact(rows)


@pytest.mark.parametrize("B", [1, 3, 8, 20])
def test_serving_keeps_the_batch_full_and_the_cap(B, hash_trace):
    for name in ("echo", "budgeted-chain", "static-tree"):
        res = replay_serving(hash_trace, ALL[name], B, k_max=CFG.k_max, min_steps=8)
        assert res.steps >= 8 and sum(res.committed) >= sum(
            hash_trace.stream_length(p) - 1 for p in range(hash_trace.num_prompts)
        )
        assert all(bool((a >= 0).all()) and a.numel() == B for a in res.accept_len)  # every slot busy
        if ALL[name].budgeted:
            assert max(res.verified_total) <= max(CFG.k_max, B)
        assert res.coverage.fraction == 1.0
        s = res.summary()
        assert s["committed_per_step"] == pytest.approx(s["accepted_per_step"] + B)


def test_serving_with_one_slot_walks_every_stream_in_order(hash_trace):
    res = replay_serving(hash_trace, ALL["chain"], 1, k_max=CFG.k_max, min_steps=1)
    # One pass over the streams: every token after each stream's first (the prefill's) is committed.
    total = sum(hash_trace.stream_length(p) - 1 for p in range(hash_trace.num_prompts))
    assert sum(res.committed) == total and res.streams_finished == hash_trace.num_prompts
