"""Drafting's prefill charge (core/prefill_share.py) and the cost budget's premium built on it."""

import pytest

from sglang_echo.core.budget import CostModelBudget
from sglang_echo.core.prefill_share import PrefillShare


def serve_waves(share, *, waves: int, B: int, reply: int, prefill_s) -> None:
    """Closed-loop waves: ``B`` requests prefilled in one batch (``prefill_s(B)`` seconds), then
    decoded one token a step for ``reply`` steps."""
    for _ in range(waves):
        share.observe_prefill(B, prefill_s(B))
        for _ in range(reply):
            share.observe_decoded(B)


def test_nothing_is_charged_before_it_is_measured_nor_at_one_request():
    share = PrefillShare()
    assert share.charge(8, 0.07) == 0.0 and share.reply_length() is None
    serve_waves(share, waves=4, B=1, reply=64, prefill_s=lambda b: 0.065)
    assert share.charge(1, 0.035) == 0.0  # one request: nothing to prefill together


def test_a_prefill_that_costs_a_step_whatever_its_size_charges_what_batching_saves():
    """Cached prompts on a CPU: a prefill of 1 or 8 requests costs 65 ms (each reads every weight
    once). Eight requests prefilled apart pay 7 x 65 ms more per wave, against 64 steps of 69 ms
    decoding them: a tenth of plain decoding's time."""
    share = PrefillShare()
    serve_waves(share, waves=30, B=8, reply=64, prefill_s=lambda b: 0.065)
    share.observe_prefill(1, 0.065)
    assert share.reply_length() == pytest.approx(64, rel=0.05)
    assert share.charge(8, 0.069) == pytest.approx(7 * 0.065 / (64 * 0.069), rel=0.05)
    # Longer replies spread the same prefills over more steps.
    longer = PrefillShare()
    serve_waves(longer, waves=30, B=8, reply=512, prefill_s=lambda b: 0.065)
    assert longer.charge(8, 0.069) == pytest.approx(share.charge(8, 0.069) / 8, rel=0.05)


def test_compute_bound_prefills_charge_nothing():
    """Prefills that cost in proportion to their requests save nothing when batched."""
    share = PrefillShare()
    for B in (1, 2, 4, 8):
        serve_waves(share, waves=5, B=B, reply=64, prefill_s=lambda b: 0.4 * b)
    assert share.charge(8, 0.069) == pytest.approx(0.0, abs=1e-6)


def test_the_reply_length_follows_the_workload():
    share = PrefillShare(window=8)
    serve_waves(share, waves=8, B=4, reply=32, prefill_s=lambda b: 0.05)
    assert share.reply_length() == pytest.approx(32, rel=0.15)  # a wave's bias over 7 waves at most
    serve_waves(share, waves=8, B=4, reply=256, prefill_s=lambda b: 0.05)
    assert share.reply_length() == pytest.approx(256, rel=0.15)


def test_the_charge_is_what_the_arms_were_seen_to_prefill_at_this_load():
    """Replies of their own lengths keep plain decoding from prefilling whole waves: 2.5 requests
    a batch against drafting's 1 charges 8 (P(1) - P(2.5) / 2.5) per 64 steps, not the bound's
    8 P(1) - P(8). Another load keeps the bound until it is measured there."""
    share = PrefillShare()
    for i in range(40):
        share.observe_prefill(2 + i % 2, 0.065, arm="plain", load=8)  # 2 and 3 requests: 2.5 a batch
        share.observe_prefill(1, 0.065, arm="draft", load=8)
        for _ in range(80):
            share.observe_decoded(8)
    length = share.reply_length()
    assert share.requests_per_prefill("plain", 8) == pytest.approx(2.5, abs=0.05)
    assert share.charge(8, 0.069) == pytest.approx(8 * (0.065 - 0.065 / 2.5) / (length * 0.069), rel=0.05)
    bound = (32 * 0.065 - 0.065) / (length * 0.069)  # 32 requests: nothing measured there
    assert share.requests_per_prefill("plain", 32) is None
    assert share.charge(32, 0.069) == pytest.approx(bound, rel=0.05)
    # Drafting batching as much as plain decoding saves nothing: no charge.
    for _ in range(60):
        share.observe_prefill(3, 0.065, arm="draft", load=8)
        share.observe_prefill(3, 0.065, arm="plain", load=8)
    assert share.charge(8, 0.069) == pytest.approx(0.0, abs=1e-9)


def test_a_prefill_counts_for_the_arm_of_most_decode_steps_before_it():
    budget = CostModelBudget(k_max=48, max_depth=1, warmup=0, explore_every=1000, plain_every=1000)
    decode(budget, 8, [True, True, False])
    budget.observe_prefill(1, 0.065)
    budget.observe_prefill(1, 0.065)  # back to back: still drafting's
    decode(budget, 8, [False, False, True])
    budget.observe_prefill(3, 0.065)
    assert budget.prefills.requests_per_prefill("draft", 8) == pytest.approx(1)
    assert budget.prefills.requests_per_prefill("plain", 8) == pytest.approx(3)
    assert budget.prefills.requests_per_prefill("plain", 32) is None
    assert "requests per prefill plain:3.0 draft:1.0" in budget.explain(8)
    assert "requests per prefill plain:- draft:-" in budget.explain(32)  # the bound, in the log
    with pytest.raises(ValueError, match="arm"):
        budget.prefills.observe_prefill(1, 0.065, arm="eagle", load=8)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="decay"):
        PrefillShare(decay=0.0)
    with pytest.raises(ValueError, match="min_prefills"):
        PrefillShare(window=4, min_prefills=8)
    with pytest.raises(ValueError, match="batching_decay"):
        PrefillShare(batching_decay=1.5)


def drafting_leads_by(budget: CostModelBudget, B: int, steps: int = 8) -> None:
    """Steps at ``B`` requests, modelled and served alike: drafting one token each, every draft
    accepted, in 0.12 s a step (2 tokens per request) against plain steps of 0.07 s (1 token):
    drafting 17% ahead."""
    decode(budget, B, ([True] * 4 + [False] * 4) * steps)


def decode(budget: CostModelBudget, B: int, arms) -> None:
    """One decode step per entry of ``arms`` (True: drafting), costed as in :func:`drafting_leads_by`."""
    for drafted in arms:
        budget.observe_step(
            batch_size=B,
            target_tokens=2 * B if drafted else B,
            verified_tokens=2 * B if drafted else B,
            draft_forwards=int(drafted),
            draft_s=0.01 * drafted,
            verify_s=0.10 if drafted else 0.069,
            step_s=0.12 if drafted else 0.07,
        )
        budget.observe_accept([int(drafted)] * B)
        budget.rates.add(B, "draft" if drafted else "plain", 2 * B if drafted else B, 0.12 if drafted else 0.07)


def test_the_budget_drafts_only_where_drafting_also_pays_for_its_prefills():
    """Drafting 17% ahead per step clears the 10% premium, and the model and the served rates both
    say draft; once prefills of one request are seen to cost as much as a step (nothing saved by
    prefilling apart is free) and replies are 64 tokens, the premium is about 20% and the steps
    decode plainly. At one request there is nothing to batch and drafting keeps its lead."""
    B = 8
    budget = CostModelBudget(k_max=48, max_depth=1, warmup=0, explore_every=1000, plain_every=1000)
    drafting_leads_by(budget, B)
    assert budget.premium(B) == pytest.approx(0.10)
    assert budget.best_depth(B) == 1 and budget.rates.verdict(B, premium=budget.premium(B)) == "draft"
    assert budget.cap(B) > B and budget.last_premium == pytest.approx(0.10)
    for _ in range(4):  # plain decoding prefills its waves of 8 together, drafting one at a time: 65 ms each
        decode(budget, B, [False])
        budget.observe_prefill(B, 0.065)
        decode(budget, B, [True])
        budget.observe_prefill(1, 0.065)
        for _ in range(64):
            budget.prefills.observe_decoded(B)
    assert budget.prefills.requests_per_prefill("plain", B) == pytest.approx(8)
    assert budget.prefills.requests_per_prefill("draft", B) == pytest.approx(1)
    assert budget.premium(B) == pytest.approx(0.10 + 7 * 0.065 / (64 * 0.07), rel=0.1)
    assert budget.best_depth(B) == 0 and budget.rates.verdict(B, premium=budget.premium(B)) is None
    assert budget.cap(B) == B and budget.last_premium == pytest.approx(budget.premium(B))
    assert budget.premium(1) == pytest.approx(0.10)
    assert budget.cap(48) == 48 and budget.last_premium is None  # a full batch weighs nothing
