"""The cost budget's served A/B test (``RealisedRates``): served steps in plain-step units,
cold steps, and when its verdict overrules the model (the model itself:
test_budget.py)."""

from collections.abc import Callable

import pytest

from sglang_echo.core.budget import CostModelBudget
from sglang_echo.core.served_rates import RealisedRates


def test_served_rates_compare_the_sizes_of_a_bucket_fairly():
    """Compute-bound verify (10 ms a token): plain steps served at 76 requests, drafting ones at
    54 (the same half-octave; a shrinking batch only drafts below K_max). Per second, drafting
    looks 24% faster per request only because its batch is smaller; in units of the predicted
    plain step at each size it commits 12% less, and the served verdict is plain decoding."""
    budget = CostModelBudget(k_max=64, max_depth=3, warmup=0, explore_every=10**6)

    def serve(B: int, arm: str, drafted: int, accepted: int, draft_s: float) -> None:
        budget._arm = arm  # as cap() would have decided (the test picks each step's side)
        verify_s = 0.01 * (B + drafted)
        budget.observe_step(
            batch_size=B,
            target_tokens=B + drafted,
            verified_tokens=B + drafted,
            draft_forwards=int(drafted > 0),
            draft_s=draft_s,
            verify_s=verify_s,
            step_s=verify_s + draft_s,
        )
        budget.observe_accept([1] * accepted + [0] * (B - accepted))

    for _ in range(4):
        serve(76, "plain", 0, 0, 0.0)
        serve(54, "draft", 11, 5, 0.02)  # a transition: not measured
        serve(54, "draft", 11, 5, 0.02)
    per_second = {"plain": 1 / 0.76, "draft": (59 / 54) / 0.67}
    assert per_second["draft"] > 1.2 * per_second["plain"]  # what seconds alone would conclude
    assert budget.rates.rate(54, "draft") == pytest.approx((59 / 54) / (0.67 / 0.54), rel=0.02)
    assert budget.rates.rate(76, "plain") == pytest.approx(1.0, rel=0.02)
    assert budget.rates.verdict(54) == budget.rates.verdict(76) == "plain"


def _serve_with_lazy_extend(
    budget: CostModelBudget,
    steps: int,
    *,
    B: int,
    accepted: list[int],
    plain_s: float,
    verify_s: float,
    drafting_s: float,
    catch_up: Callable[[int], float],
    slow_steps: int = 0,
) -> list[bool]:
    """Steps of ``B`` requests: a plain step takes ``plain_s`` (2 ms beyond its verify) and defers
    its draft extend; a drafting step (depth 2, request i accepting ``accepted[i]`` drafts) takes
    ``drafting_s`` (``verify_s`` of verify, 8 ms its draft extend, the rest its two draft forwards;
    80 ms during the first ``slow_steps``: a phase where drafting does not pay) plus ``catch_up(n)``
    after ``n`` plain steps, the extends they deferred. Returns which steps drafted."""
    deferred, drafted_steps = 0, []
    for step in range(steps):
        cap = budget.cap(B)
        drafting = cap > B
        caught_up = catch_up(deferred) if drafting and deferred else 0.0
        deferred = 0 if drafting else deferred + 1
        own = 0.080 if step < slow_steps else drafting_s
        budget.observe_step(
            batch_size=B,
            target_tokens=3 * B if drafting else B,
            verified_tokens=3 * B if drafting else B,
            draft_forwards=2 if drafting else 0,
            draft_s=own - verify_s - 0.008 + caught_up if drafting else 0.0,
            verify_s=verify_s if drafting else plain_s - 0.002,
            step_s=own + caught_up if drafting else plain_s,
            cap=cap,
        )
        budget.observe_accept(accepted if drafting else [0] * B)
        drafted_steps.append(drafting)
    return drafted_steps


def _budget() -> CostModelBudget:
    return CostModelBudget(k_max=40, max_depth=2, warmup=4, explore_every=32, plain_every=16)


def test_drafting_pays_again_after_a_phase_where_it_did_not():
    """With lazy extend a drafting step after a plain run catches up the run's draft extends. After
    a phase where drafting did not pay, the probes and explorations of drafting pay the plain
    runs' debt; as transitions they measure nothing, and the steps draft again once drafting pays
    (1.8 tokens per request in 45 ms against 1 in 30: 20% ahead, past the premium drafting must
    beat)."""
    budget = _budget()
    five = dict(B=5, accepted=[1, 1, 1, 1, 0], plain_s=0.030, verify_s=0.036, drafting_s=0.045, slow_steps=300)
    drafted = _serve_with_lazy_extend(budget, 1200, catch_up=lambda n: 0.004 * n, **five)
    assert sum(drafted[250:300]) <= 10  # the slow phase: plain, with probes
    assert sum(drafted[-200:]) >= 160
    assert budget.rates.verdict(5) == "draft"


def test_plain_decoding_wins_where_drafting_measurably_loses():
    """Eight requests on a CPU: plain steps take 44 ms, drafting steps 70 ms for 1.5 tokens per
    request (6% fewer tokens per second), and the drafting step after a plain probe catches up its
    extends in a draft forward (9 ms). Charged to the probe, plain decoding read 53 ms a step and
    drafting won the served test; charged a drafting step's rest (its draft extend), it was
    predicted at 52 ms and drafting won the model's choice. As measured now, both settle on plain
    decoding."""
    budget = _budget()
    eight = dict(B=8, accepted=[1, 1, 1, 1, 0, 0, 0, 0], plain_s=0.044, verify_s=0.054, drafting_s=0.070)
    drafted = _serve_with_lazy_extend(budget, 1200, catch_up=lambda n: 0.008 + 0.001 * n, **eight)
    assert sum(drafted[-400:]) <= 40
    assert budget.rates.verdict(8) == "plain" and budget.best_depth(8) == 0
    assert budget.step_seconds(8, 0) == pytest.approx(0.044, rel=0.02)


def test_served_rates_are_converted_with_the_unit_as_it_stands():
    """Steps are kept in seconds and converted with the current unit. At a new load the budget's
    plain step is first predicted from other loads (here 4x the real 40 ms at 8 requests);
    converted when served, the drafting steps taken then would look four times faster and win
    the verdict for the next twenty steps, although they commit 1.6 tokens per request in 2.9
    plain steps."""
    plain_step = {8: 0.160}
    rates = RealisedRates(unit=lambda B: plain_step[B])
    for _ in range(3):
        rates.add(8, "draft", 13, 0.115)
    plain_step[8] = 0.040  # the model has measured this load
    for _ in range(3):
        rates.add(8, "plain", 8, 0.040)
    assert rates.rate(8, "plain") == pytest.approx(1.0)
    assert rates.rate(8, "draft") == pytest.approx((13 / 8) / (0.115 / 0.040))
    assert rates.verdict(8) == "plain"


def test_a_cold_step_is_left_out_of_the_served_rates():
    """A step four times its arm's median time (a cold one) does not count."""
    rates = RealisedRates()
    rates.add(1, "draft", 2, 3.5)  # the server's first drafting step
    for _ in range(4):
        rates.add(1, "draft", 2, 0.050)
        rates.add(1, "plain", 1, 0.035)
    assert rates.rate(1, "draft") == pytest.approx(2 / 0.050)
    assert rates.verdict(1) == "draft"


def test_served_rates_within_their_noise_leave_the_choice_to_the_model():
    """The served A/B test overrules the model only where the arms differ by more than 5%."""
    rates = RealisedRates()
    for _ in range(5):
        rates.add(4, "plain", 4, 1.0)
        rates.add(4, "draft", 4, 1.0 / 1.03)  # 3% ahead: noise
    assert rates.verdict(4) is None
    rates = RealisedRates()
    for _ in range(5):
        rates.add(4, "plain", 4, 1.0)
        rates.add(4, "draft", 4, 1.0 / 1.10)
    assert rates.verdict(4) == "draft"
    for _ in range(20):  # drafting's rate falls far below plain decoding's
        rates.add(4, "draft", 4, 2.0)
    assert rates.verdict(4) == "plain"
    budget = CostModelBudget(k_max=16, max_depth=2)
    assert "verdict" in budget.explain(4) and "D2:" in budget.explain(4)


def test_a_load_left_for_long_starts_its_test_afresh():
    """Steps of a load served long ago (here the cold first steps of a server, before a level at
    one request) are forgotten when the load comes back; a load served all along keeps its steps,
    however rarely one arm is sampled."""
    rates = RealisedRates(stale=100)
    for _ in range(3):
        rates.visit(8)
        rates.add(8, "plain", 8, 0.080)  # cold
    for _ in range(20):
        rates.visit(8)
        rates.add(8, "draft", 12, 0.090)
    assert rates.verdict(8) == "draft"
    for _ in range(101):
        rates.visit(1)
    rates.visit(8)
    assert rates.samples(8, "plain") == rates.samples(8, "draft") == 0
    assert rates.verdict(8) is None
    for _ in range(3):
        rates.add(8, "plain", 8, 0.045)
    for step in range(300):  # served at 8 throughout: the plain steps stay however old they grow
        rates.visit(8)
        if step % 30 == 0:
            rates.add(8, "draft", 12, 0.090)
    assert rates.samples(8, "plain") == 3
    assert rates.verdict(8) == "plain"


def test_the_budget_visits_every_load_it_caps():
    budget = CostModelBudget(k_max=64, max_depth=3, warmup=0)
    budget.cap(8)
    budget.rates.add(8, "plain", 8, 0.05)
    for _ in range(budget.rates.stale + 1):
        budget.cap(1)
    budget.cap(8)
    assert budget.rates.samples(8, "plain") == 0


def test_drafting_must_beat_plain_decoding_by_its_premium():
    """Drafting steps 6% ahead of plain ones per step lost 4-10% of a server's throughput at 8
    requests on a CPU (transitions, explorations, requests finishing apart and prefilled one at a
    time): below the premium (10%) the steps settle on plain decoding, with none they draft."""
    eight = dict(B=8, accepted=[1, 1, 1, 1, 0, 0, 0, 0], plain_s=0.044, verify_s=0.048, drafting_s=0.062)
    drafted = {}
    for premium in (0.10, 0.0):
        budget = CostModelBudget(k_max=40, max_depth=2, warmup=4, explore_every=32, plain_every=16, premium=premium)
        drafted[premium] = sum(_serve_with_lazy_extend(budget, 1200, catch_up=lambda n: 0.008, **eight)[-400:])
    assert drafted[0.10] <= 40 and drafted[0.0] >= 300
