"""A failing drafter costs no request: its step is verified as plain decoding (integration.faults)."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch

from sglang_echo.core import build_trees, make_policy
from sglang_echo.core.factory import PolicyConfig
from sglang_echo.core.synthetic import SyntheticDrafter, SyntheticWorld
from sglang_echo.integration.faults import DraftGuard, FaultKind, parse_injection

VOCAB, BATCH = 500, 6
CFG = PolicyConfig(k_max=4 * BATCH, max_depth=4, w_def=1, w_max=2)


def _step(guard: DraftGuard, drafter=None):
    world = SyntheticWorld(BATCH, vocab=VOCAB, seed=2)
    roots = torch.randint(0, VOCAB, (BATCH,), generator=torch.Generator().manual_seed(1))
    return guard.build(make_policy("echo", CFG), drafter or SyntheticDrafter(world), roots, None), roots, world


class Garbage(SyntheticDrafter):
    def propose(self, frontier, k):
        cands = super().propose(frontier, k)
        return replace(cands, tokens=cands.tokens - VOCAB)  # negative ids


class Broken(SyntheticDrafter):
    def propose(self, frontier, k):
        raise ValueError("the draft head's forward failed")


def test_a_healthy_drafter_builds_the_policys_trees():
    (trees, _, faulted), roots, world = _step(DraftGuard(VOCAB))
    want, _ = build_trees(make_policy("echo", CFG), SyntheticDrafter(world), roots)
    assert not faulted and torch.equal(trees.tokens, want.tokens) and int(trees.sizes.sum()) > BATCH


@pytest.mark.parametrize("drafter, kind", [(Broken, FaultKind.RAISE), (Garbage, FaultKind.GARBAGE)])
def test_a_failing_drafter_gives_plain_decoding_logged_once_and_counted(drafter, kind, caplog):
    seen = []
    guard = DraftGuard(VOCAB, seen.append)
    world = SyntheticWorld(BATCH, vocab=VOCAB, seed=2)
    with caplog.at_level(logging.ERROR, logger="sglang_echo.integration.faults"):
        for _ in range(3):
            (trees, _, faulted), roots, _ = _step(guard, drafter(world))
            assert faulted and torch.equal(trees.tokens, roots) and trees.sizes.tolist() == [1] * BATCH
    assert seen == [kind] * 3
    assert len([r for r in caplog.records if "the drafter failed" in r.message]) == 1


def test_injected_faults_play_in_their_drafting_steps():
    seen = []
    guard = DraftGuard(VOCAB, seen.append, injected=parse_injection("raise:2,garbage:3"))
    faults = [_step(guard)[0][2] for _ in range(4)]
    assert faults == [False, True, True, False] and seen == [FaultKind.RAISE, FaultKind.GARBAGE]


def test_injection_spec_is_checked():
    assert parse_injection("") == {} and parse_injection("garbage:7") == {7: FaultKind.GARBAGE}
    with pytest.raises(ValueError, match="'explode:3' is not raise:N or garbage:N"):
        parse_injection("explode:3")
