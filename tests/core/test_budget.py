"""The cost-model budget: its decision and the per-step cap it hands build_trees (its measured
curves: test_cost_curve.py; its served A/B test: test_served_rates.py)."""

import pytest
import torch

from sglang_echo.core.budget import CostModelBudget
from sglang_echo.core.cost_curve import half_octave
from sglang_echo.core.factory import PolicyConfig, make_policy
from sglang_echo.core.policy import build_trees
from sglang_echo.core.synthetic import SyntheticDrafter, SyntheticWorld


def feed(
    budget: CostModelBudget,
    *,
    steps: int,
    B: int,
    depth: int,
    accept: list[float],
    verify,
    draft_per_depth: float,
    rest: float = 0.0,
) -> None:
    """Steps of B requests drafted to ``depth`` (chains): request i accepts its first d drafts
    for the first ``accept[d-1]`` share of the batch (so G(depth) ~ sum(accept[:depth]))."""
    for _ in range(steps):
        K = B * (1 + depth)
        v, dr = verify(K), depth * draft_per_depth
        budget.observe_step(
            batch_size=B,
            target_tokens=K,
            verified_tokens=K,
            draft_forwards=depth,
            draft_s=dr,
            verify_s=v,
            step_s=v + dr + rest,
        )
        acc = [sum(1 for a in accept[:depth] if i < a * B) for i in range(B)]
        budget.observe_accept(acc)


def feed_flat(budget: CostModelBudget, loads) -> None:
    """Six steps per ``(B, depth)`` of ``loads`` at a GPU-like cost: verify flat at 20 ms, 1 ms a
    draft forward, acceptance 0.8 / 0.6 / 0.45 / 0.3 by depth."""
    for B, depth in loads:
        feed(
            budget,
            steps=6,
            B=B,
            depth=depth,
            accept=[0.8, 0.6, 0.45, 0.3],
            verify=lambda K: 0.02,
            draft_per_depth=0.001,
        )


def test_compute_bound_verify_turns_speculation_off_at_high_load_only():
    """A CPU-like cost: every verified token costs (a + b K); drafting costs a forward per depth."""
    budget = CostModelBudget(k_max=64, max_depth=4, warmup=4, explore_every=1000, decay=0.99)
    verify = lambda K: 0.06 + 0.002 * K  # noqa: E731
    accept = [0.5, 0.3, 0.2, 0.1]
    for B in (8, 16, 24, 32, 40):  # varied loads (draft cost a line in B); >= 8: shares of B are near exact
        feed(budget, steps=8, B=B, depth=2, accept=accept, verify=verify, draft_per_depth=0.006 + 0.0005 * B)
    assert budget.expected_gain(2) == pytest.approx(0.8, abs=0.05)  # measured: 0.5 + 0.3
    assert budget.expected_gain(1) == pytest.approx(0.4, abs=0.03)  # below the data: a line from 0
    assert budget.expected_gain(4) == budget.expected_gain(2)  # past the data: no evidence, no credit
    assert budget.draft_forwards(1) == pytest.approx(1.0) and budget.draft_forwards(2) == pytest.approx(2.0)

    # B = 1: a draft costs 2 ms of verify and 6.5 ms of drafting on a 62 ms step, and G(1) = 0.4:
    # 1.4 tokens / 70.5 ms > 1 / 62 ms, so the cap allows drafts ...
    assert budget.cap(1) == 1 + budget.best_depth(1) > 1  # 2 ms a token: no verify time to spare
    # ... B = 32: 32 more verified tokens (+64 ms) and a 22 ms draft forward buy 13 tokens on a
    # 124 ms step: 45 / 210 ms < 32 / 124 ms, so the step is plain decoding.
    assert budget.best_depth(32) == 0 and budget.cap(32) == 32
    ar = budget.expected_rate(32, 0)
    assert ar == pytest.approx(32 / verify(32), rel=0.02)
    assert all(budget.expected_rate(32, d) < ar for d in (1, 2, 3, 4))


def test_flat_verify_cost_spends_the_whole_budget():
    """A GPU-like cost (verify flat in K up to far past K_max): deep trees pay, K_max binds."""
    budget = CostModelBudget(k_max=64, max_depth=4, warmup=0, explore_every=1000)
    feed_flat(budget, ((4, 4), (8, 4), (16, 3), (8, 1)))
    assert budget.best_depth(8) == 4
    # flat verify: every token up to K_max is free; step 2 probes plain decoding (no plain step seen yet)
    assert [budget.cap(8), budget.cap(32), budget.cap(32)] == [64, 32, 64]


def test_an_allowance_past_k_max_is_weighed_as_the_cap_it_gets():
    """At 16 requests a K_max of 64 allows 3 drafts each: an allowance of 4 gets the same cap, so
    the model must not credit it with a fourth draft's acceptance (measured at 8 requests)."""
    budget = CostModelBudget(k_max=64, max_depth=4, warmup=0, explore_every=1000)
    feed_flat(budget, ((8, 4), (8, 2), (16, 2), (16, 3)))
    assert budget.reach(16) == 3 and budget.reach(8) == 7 and budget.reach(64) == 0
    assert budget.expected_gain(4) > budget.expected_gain(3)  # a fourth draft pays where it fits
    assert budget.expected_rate(16, 4) == budget.expected_rate(16, 3)
    assert budget.step_seconds(16, 4) == budget.step_seconds(16, 3)
    assert budget.best_drafting_depth(16) == 3 and budget.best_depth(8) == 4
    # 24 requests: 40 drafts among them, 5/3 each, whatever the allowance asks
    assert budget.expected_rate(24, 2) == budget.expected_rate(24, 4) > budget.expected_rate(24, 1)


def test_tokens_below_the_knee_are_free():
    """Verify flat up to 16 tokens, then 2 ms each: batch 2 drafts to D*, then fills up to the knee."""
    budget = CostModelBudget(k_max=64, max_depth=4, warmup=0, explore_every=1000)
    verify = lambda K: 0.06 + 0.002 * max(K - 16, 0)  # noqa: E731
    for B, depth in ((1, 1), (2, 2), (4, 3), (8, 4), (16, 2), (24, 1), (32, 1)):
        feed(budget, steps=6, B=B, depth=depth, accept=[0.5, 0.3, 0.15, 0.05], verify=verify, draft_per_depth=0.01)
    d = budget.best_depth(2)
    assert 1 <= d < 4 and 2 * (1 + d) < budget.cap(2) <= 16 + 1  # 2% of a ~80 ms step buys < 1 token past 16


def test_warmup_and_explorations_draft_until_the_gap_backs_off():
    """Warm-up and explorations draft; while each is followed by plain decoding at the same load,
    the gap to the next doubles (4, 8, 16 = explore_backoff x explore_every); another load has its own."""
    budget = CostModelBudget(k_max=48, max_depth=3, warmup=3, explore_every=4, explore_backoff=4, explore_burst=1)
    assert [budget.cap(16) for _ in range(3)] == [48, 32, 48]  # nothing measured yet: K_max, then 1 per request
    feed(budget, steps=3, B=16, depth=1, accept=[0.05], verify=lambda K: 0.05 + 0.01 * K, draft_per_depth=0.05)
    caps = [budget.cap(16) for _ in range(32)]  # calls 4..35: drafting does not pay, so plain between
    assert set(caps) == {16, 32, 48}
    assert [4 + i for i, k in enumerate(caps) if k > 16] == [4, 12, 28]
    assert budget.explore_gap(16) == 16
    caps = [budget.cap(4) for _ in range(5)]  # calls 36..40: batch 4, another load
    assert [k > 4 for k in caps] == [False, False, False, True, False] and budget.explore_gap(4) == 8
    assert budget.explore_gap(16) == 16  # batch 16 keeps its backed-off schedule


def test_sampling_steps_take_the_allowances_in_turn():
    """Warm-up and exploration caps cycle K_max, D_top / 2, D_top / 4 ... 1 per request, so the
    model measures acceptance at the small allowances too (``D_top``: what K_max leaves per
    request, at most the widest tree's ``max_drafts``)."""
    budget = CostModelBudget(k_max=64, max_depth=4, warmup=8, max_drafts=13)
    assert [budget.cap(1) for _ in range(8)] == [64, 7, 4, 2] * 2  # D_top 13: 6, 3, 1 drafts
    budget = CostModelBudget(k_max=64, max_depth=4, warmup=8, max_drafts=13)
    assert [budget.cap(8) for _ in range(4)] == [64, 32, 16, 64]  # D_top 7: 3, 1 drafts
    budget = CostModelBudget(k_max=64, max_depth=4, warmup=8, max_drafts=13)
    assert [budget.cap(32) for _ in range(2)] == [64, 64]  # room for one draft per request only


def test_a_shrinking_batch_keeps_each_loads_exploration_schedule():
    """Waves of requests finishing one by one (batch 24 down to 1, again and again): each load
    explores once per ``gap`` steps served at it, backing off there, instead of every load
    restarting one shared schedule."""
    budget = CostModelBudget(k_max=48, max_depth=3, warmup=0, explore_every=4, explore_backoff=4, explore_burst=1)
    feed(budget, steps=3, B=16, depth=1, accept=[0.05], verify=lambda K: 0.05 + 0.01 * K, draft_per_depth=0.05)
    explored = [sum(budget.cap(B) > B for B in range(24, 0, -1)) for _ in range(12)]
    # 24 steps per wave over 10 half-octaves; the three with 4 or more (24-20, 19-14, 13-10)
    # explore in the first wave. One shared schedule, restarted at every half-octave, explored
    # 4 times in every wave (48).
    assert explored[0] == 3 and sum(explored) <= 30
    assert {budget.explore_gap(B) for B in (20, 16, 12)} == {16}  # backed off all the way


def test_a_verdict_for_drafting_resets_the_exploration_gap():
    budget = CostModelBudget(k_max=48, max_depth=3, warmup=0, explore_every=4, explore_backoff=8, explore_burst=1)
    feed(budget, steps=3, B=8, depth=1, accept=[0.05], verify=lambda K: 0.05 + 0.01 * K, draft_per_depth=0.05)
    for _ in range(20):
        budget.cap(8)
    assert budget.explore_gap(8) > 4  # plain decoding, confirmed by every exploration
    # The workload changes: drafts are accepted and verifying them is free.
    feed(budget, steps=200, B=8, depth=3, accept=[0.9, 0.8, 0.7], verify=lambda K: 0.02, draft_per_depth=0.001)
    assert budget.best_depth(8) == 3
    budget.cap(8)
    budget.cap(8)  # (one of the two may be an exploration)
    assert budget.explore_gap(8) == 4


def test_measured_rates_overrule_a_model_that_says_plain():
    """The model prices drafting below plain decoding (its gains were measured on short, rejected
    trees), but served, drafting steps commit 3 tokens in 0.08 s and plain ones 1 in 0.032 s: the
    steps draft (at the model's best drafting allowance, raised to K_max: the verify pass was
    measured at one size, so more tokens look free) and every ``plain_every``-th one probes plain
    decoding."""
    budget = CostModelBudget(k_max=48, max_depth=3, warmup=0, explore_every=1000, plain_every=4)
    feed(budget, steps=3, B=1, depth=1, accept=[0.0], verify=lambda K: 0.03 * K, draft_per_depth=0.01)
    assert budget.best_depth(1) == 0
    assert [budget.cap(1) for _ in range(4)] == [1, 1, 1, 1]  # nothing served to overrule it yet
    for _ in range(3):
        budget.rates.add(1, "plain", 1, 0.032)
        budget.rates.add(1, "draft", 3, 0.08)
    assert [budget.cap(1) for _ in range(8)] == [48, 1, 48, 48, 48, 1, 48, 48]  # calls 5..12: 6 and 10 probe


def test_an_overruled_model_drafts_at_its_best_drafting_allowance():
    """Served, drafting wins where the model says plain (at 8 requests on a CPU, noise can do that):
    the steps draft at the allowance the model ranks best among the drafting ones (one draft per
    request, whose verify costs the least), not at K_max, the dearest step there is."""
    budget = CostModelBudget(k_max=48, max_depth=4, warmup=0, explore_every=1000, plain_every=1000)
    verify = lambda K: 0.04 + 0.002 * K  # noqa: E731
    for depth in (1, 2, 3, 4):
        feed(budget, steps=4, B=8, depth=depth, accept=[0.3, 0.2, 0.1, 0.05], verify=verify, draft_per_depth=0.01)
    assert budget.best_depth(8) == 0 and budget.best_drafting_depth(8) == 1
    for _ in range(budget.rates.min_samples):
        budget.rates.add(8, "plain", 8, 0.056)
        budget.rates.add(8, "draft", 12, 0.07)
    assert budget.rates.verdict(8) == "draft"
    assert budget.cap(8) == 16  # 8 roots + one draft each: verify(17) would add more than 2% of the step


def test_plain_steps_probe_the_alternative_while_drafting_pays():
    """Drafting pays (flat verify), so every 4th step that would draft decodes plainly instead;
    the K_max exploration steps keep their own turn."""
    budget = CostModelBudget(k_max=48, max_depth=3, warmup=0, explore_every=8, plain_every=4)
    feed(budget, steps=4, B=8, depth=3, accept=[0.9, 0.8, 0.7], verify=lambda K: 0.02, draft_per_depth=0.001)
    caps = [budget.cap(8) for _ in range(8)]  # calls 1..8: 2 and 6 plain, 8 explores
    assert caps == [48, 8, 48, 48, 48, 8, 48, 48]
    assert budget.best_depth(8) == 3


def test_measured_rates_veto_drafting_the_model_favours():
    """A model wrong in a way no single curve shows (here: it credits drafts with ten times the
    acceptance served) drafts; but served, a drafting step takes 0.3 s for 2 tokens per request
    and a plain one 0.05 s for 1. The A/B test of the two turns the steps plain, keeps probing
    drafting every ``plain_every``-th step, and lets drafting back once it commits more per second
    (then plain decoding's probes come every ``4 * plain_every``-th step: drafting is more than 25%
    ahead)."""
    B, every = 8, 4
    budget = CostModelBudget(k_max=48, max_depth=3, warmup=4, explore_every=1000, plain_every=every)
    budget.expected_gain = lambda drafted: 10 * CostModelBudget.expected_gain(budget, drafted)
    draft_s = [0.3]

    def serve(steps: int) -> list[int]:
        caps = []
        for _ in range(steps):
            cap = budget.cap(B)
            drafted = cap > B
            step_s = draft_s[0] if drafted else 0.05
            budget.observe_step(
                batch_size=B,
                target_tokens=cap,
                verified_tokens=B * 2 if drafted else B,
                draft_forwards=int(drafted),
                draft_s=0.01 * drafted,
                verify_s=0.02,
                step_s=step_s,
                cap=cap,
            )
            budget.observe_accept([1] * B if drafted else [0] * B)
            caps.append(cap)
        return caps

    serve(24)
    assert budget.best_depth(B) > 0  # the model still says draft ...
    assert budget.rates.verdict(B) == "plain"  # ... the served rates say 6.7 vs 20 tokens/s per request
    assert sum(c > B for c in serve(8)) == 4  # drafting only on its probes, two steps each (one a transition)
    draft_s[0] = 0.06  # drafting now commits 33 tokens/s per request: the veto lifts
    serve(80)  # (a drafting probe's first step, a transition, is not counted)
    assert budget.rates.verdict(B) == "draft"
    # Plain only on its probe steps: every 4 x plain_every, now that drafting clearly pays (33 vs 20).
    assert sum(c > B for c in serve(32)) == 30


def test_an_exploration_is_a_burst_whose_first_step_measures_no_drafting_cost():
    """An exploration drafts ``explore_burst`` steps at K_max. Its first step follows plain ones:
    a transition (cold drafter, deferred extends), which measures neither ``t_draft`` nor the
    drafting side of the A/B test (nor plain decoding's: its catch-up of their extends is a
    switching cost)."""
    B = 4
    budget = CostModelBudget(k_max=48, max_depth=2, warmup=0, explore_every=8, explore_burst=3, decay=1.0)
    caps, reasons, plain_seconds = [], [], []
    for step in range(16):
        cap = budget.cap(B)
        drafting = cap > B
        first = drafting and not (caps and caps[-1] > B)
        decision = budget.observe_step(
            batch_size=B,
            target_tokens=3 * B if drafting else B,
            verified_tokens=3 * B if drafting else B,
            draft_forwards=2 if drafting else 0,
            draft_s=(0.5 if first else 0.01) if drafting else 0.0,  # the transition is slow
            verify_s=0.02,
            step_s=(0.52 if first else 0.03) if drafting else 0.02,
            cap=cap,
        )
        budget.observe_accept([1] * B if drafting else [0] * B)
        caps.append(cap)
        reasons.append(decision[1])
        plain_seconds.append(sum(s for _, _, s in budget.rates._steps.get((half_octave(B), "plain"), ())))
    assert reasons[6:11] == ["model", "explore", "explore", "explore", "model"]
    assert budget.draft.predict(B) == pytest.approx(0.005)  # the steady steps' 10 ms over 2 forwards
    assert budget.rates.samples(B, "draft") == sum(c > B for c in caps) - 1  # all but the transition
    assert plain_seconds[7] == plain_seconds[6]  # nor went to plain decoding


def test_accepts_are_matched_to_their_steps_in_order():
    """Overlap scheduling reports a step's acceptance after the next step was drafted."""
    budget = CostModelBudget(k_max=64, max_depth=2, decay=1.0)
    kw = dict(target_tokens=6, draft_forwards=2, draft_s=0.01, verify_s=0.05, step_s=0.07)
    budget.observe_step(batch_size=2, verified_tokens=6, **kw)  # 2 drafts per request
    budget.observe_step(batch_size=3, verified_tokens=6, **kw)  # 1 draft per request
    budget.observe_accept([2, 1])  # step 1
    budget.observe_accept([0, 0, 2])  # step 2
    assert budget.expected_gain(2) == pytest.approx(1.5) and budget.expected_gain(1) == pytest.approx(2 / 3)
    budget.observe_accept([1, 1])  # no step left to match: ignored
    budget.observe_step(batch_size=2, verified_tokens=4, **kw)
    budget.observe_accept([1, 1, 1])  # a different batch: ignored
    assert budget.expected_gain(1) == pytest.approx(2 / 3)


def test_gated_trees_are_credited_by_what_the_batch_accepted():
    """Gates send a quarter of the batch 4 deep and the rest nowhere (2 drafts per request on
    average per the cap, i.e. D = 1): the confident quarter accepts 3 of 4. What D = 1 buys is
    what the batch accepted per request (0.75), not the confident trees' per-depth rates applied
    to everyone."""
    budget = CostModelBudget(k_max=64, max_depth=4, warmup=0, explore_every=1000, decay=1.0)
    B = 8
    for _ in range(4):
        budget.observe_step(
            batch_size=B,
            target_tokens=2 * B,
            verified_tokens=2 * B,
            draft_forwards=4,
            draft_s=0.04,
            verify_s=0.1,
            step_s=0.15,
        )
        budget.observe_accept([3, 3, 0, 0, 0, 0, 0, 0])
    assert budget.expected_gain(1) == pytest.approx(0.75)
    assert budget.draft_forwards(1) == pytest.approx(4.0)  # the gated trees went 4 deep for D = 1


def test_a_cap_is_credited_with_what_the_gates_spend_of_it():
    """Batch 1 (cap 64) drafted 4 per request and accepted 3; at batch 8 a cap allowing 4 per
    request gets 2 spent (the gates truncate) and 0.5 accepted. The cap of 40 buys G(S(4)) = G(2),
    not the batch-1 G(4), so batch 8 decodes plainly."""
    budget = CostModelBudget(k_max=64, max_depth=4, warmup=0, explore_every=1000, decay=1.0)
    verify = lambda n: 0.05 + 0.002 * n  # noqa: E731

    def step(B: int, cap: int, drafted: int, accepted: list[int]) -> None:
        n = B * (1 + drafted)
        budget.observe_step(
            batch_size=B,
            target_tokens=n,
            verified_tokens=n,
            draft_forwards=drafted,
            draft_s=0.005 * drafted,
            verify_s=verify(n),
            step_s=verify(n) + 0.005 * drafted,
            cap=cap,
        )
        budget.observe_accept(accepted)

    for _ in range(4):
        step(1, 64, 4, [3])
        step(8, 40, 2, [1, 0] * 4)
    assert budget.spent(4) == pytest.approx(2.0) and budget.spent(63) == pytest.approx(4.0)
    assert budget.expected_gain(4) == pytest.approx(3.0)  # what drafting 4 bought at batch 1
    assert budget.expected_rate(8, 4) == pytest.approx(8 * 1.5 / (verify(24) + 2 * 0.005))
    assert budget.best_depth(8) == 0 and budget.cap(8) == 8
    warm = CostModelBudget(k_max=64, max_depth=4, warmup=0, decay=1.0)  # only a K_max step seen at batch 1
    warm.observe_step(
        batch_size=1,
        target_tokens=5,
        verified_tokens=5,
        draft_forwards=4,
        draft_s=0.02,
        verify_s=0.06,
        step_s=0.08,
        cap=64,
    )
    assert [warm.spent(d) for d in (1, 3, 4, 100)] == [1.0, 3.0, 4.0, 4.0]  # spent 4 of 63: so all of 1-4


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="k_max"):
        CostModelBudget(k_max=0, max_depth=4)
    with pytest.raises(ValueError, match="explore_every"):
        CostModelBudget(k_max=8, max_depth=4, explore_every=1)
    with pytest.raises(ValueError, match="explore_backoff=0"):
        CostModelBudget(k_max=8, max_depth=4, explore_backoff=0)
    with pytest.raises(ValueError, match="plain_every"):
        CostModelBudget(k_max=8, max_depth=4, plain_every=1)


def drafter(B: int) -> SyntheticDrafter:
    return SyntheticDrafter(SyntheticWorld(B, vocab=50, seed=1))


class _MustNotDraft:
    def propose(self, frontier, k):
        raise AssertionError("a zero draft budget must not call the drafter")


@pytest.mark.parametrize("name", ["echo", "dense-gating", "budgeted-chain"])
def test_build_trees_honours_a_per_step_cap(name):
    B = 6
    cfg = PolicyConfig(k_max=40, max_depth=5, w_def=1, w_max=3, topk=3, total_tokens=16)
    policy = make_policy(name, cfg)
    roots = torch.arange(B) + 3
    trees, _ = build_trees(policy, _MustNotDraft(), roots, k_max=B)  # plain decoding
    assert trees.sizes.tolist() == [1] * B
    full, _ = build_trees(policy, drafter(B), roots)
    capped, _ = build_trees(policy, drafter(B), roots, k_max=B + 5)
    assert int(capped.sizes.sum()) <= B + 5 < int(full.sizes.sum()) <= 40
    wide, _ = build_trees(policy, drafter(B), roots, k_max=1000)  # never raises the cap
    assert wide.sizes.tolist() == full.sizes.tolist()


def test_unbudgeted_policies_ignore_the_cap():
    cfg = PolicyConfig(k_max=40, max_depth=3, w_def=1, w_max=3, topk=3, total_tokens=10)
    policy = make_policy("chain", cfg)
    roots = torch.arange(4)
    a, _ = build_trees(policy, drafter(4), roots)
    b, _ = build_trees(policy, drafter(4), roots, k_max=4)
    assert a.sizes.tolist() == b.sizes.tolist() == [4] * 4


def test_every_step_reports_why_it_drafted_or_not():
    """``observe_step`` returns the step's ``(arm, reason)``, which the worker exports per arm and
    reason (``echo_budget_steps_total``) so the price of measuring is visible."""
    budget = CostModelBudget(k_max=48, max_depth=3, warmup=1, explore_every=4, plain_every=4, explore_burst=1)

    def step(B: int, forwards: int = 0):
        cap = budget.cap(B)
        return budget.observe_step(
            batch_size=B,
            target_tokens=cap,
            verified_tokens=cap,
            draft_forwards=forwards,
            draft_s=0.01 * forwards,
            verify_s=0.05,
            step_s=0.06 + 0.01 * forwards,
            cap=cap,
        )

    assert (
        budget.observe_step(
            batch_size=8, target_tokens=8, verified_tokens=8, draft_forwards=0, draft_s=0.0, verify_s=0.05, step_s=0.05
        )
        is None
    )  # no cap() decided it
    assert step(8, forwards=1) == ("draft", "warmup")
    assert [step(8) for _ in range(2)] == [("plain", "model")] * 2  # nothing gained yet: plain decoding
    assert step(8, forwards=1) == ("draft", "explore")  # call 4
    for _ in range(3):  # served: drafting commits 2 tokens per request in 0.085 s, plain 1 in 0.05 s
        budget.rates.add(8, "plain", 8, 0.05)
        budget.rates.add(8, "draft", 16, 0.085)  # 18% ahead: not decisive, plain probes keep their period
    assert [step(8, forwards=1) for _ in range(4)] == [  # calls 5..8: 6 probes plain decoding, 8 explores
        ("draft", "measured"),
        ("plain", "probe"),
        ("draft", "measured"),
        ("draft", "explore"),
    ]


def test_warmup_and_explorations_wait_for_room_to_draft():
    budget = CostModelBudget(k_max=64, max_depth=3, warmup=2, explore_every=4, explore_burst=1)

    def step(B: int):
        cap = budget.cap(B)
        forwards = int(cap > B)
        return cap, budget.observe_step(
            batch_size=B,
            target_tokens=min(cap, B * 4),
            verified_tokens=min(cap, B * 4),
            draft_forwards=forwards,
            draft_s=0.01 * forwards,
            verify_s=0.05,
            step_s=0.06,
        )

    assert [step(B) for B in (128, 64, 64, 64, 64)] == [(64, ("plain", "full"))] * 5  # steps 1..5, exploration due
    assert step(40) == (40, ("plain", "model"))  # room for 24 drafts among 40 requests: not enough to measure
    assert step(32) == (64, ("draft", "warmup"))  # a draft per request: the warm-up starts


def test_the_model_weighs_every_allowance_the_widest_tree_can_spend():
    """Alg. 1's tree at depth 4 holds up to w_def * 4 + w_max = 6 drafts per request: with a flat
    verify cost and acceptance still growing past 4 drafts, the model allows all 6 (a chain's
    budget, max_drafts = max_depth, stops at 4)."""

    def trained(max_drafts):
        budget = CostModelBudget(k_max=640, max_depth=4, warmup=0, explore_every=1000, max_drafts=max_drafts)
        B = 10
        for drafted, accepting in ((2, 4), (4, 6), (6, 9)):  # accepting: requests that accept a draft
            for _ in range(8):
                budget.observe_step(
                    batch_size=B,
                    target_tokens=B * (1 + drafted),
                    verified_tokens=B * (1 + drafted),
                    draft_forwards=4,
                    draft_s=0.004,
                    verify_s=0.03,
                    step_s=0.035,
                    cap=B * (1 + drafted),
                )
                budget.observe_accept([1] * accepting + [0] * (B - accepting))
        return budget

    assert trained(6).best_depth(10) == 6
    assert trained(None).best_depth(10) == 4


def test_a_plain_steps_rest_is_measured_on_plain_steps_alone():
    """D = 0 is charged the rest of a plain step (0.8 ms here), not a drafting step's (its draft
    extend, 6 ms) nor that of a step allowed to draft whose gates cut every tree (the draft setup
    and the catch-up of deferred extends, 4 ms)."""
    B = 8
    budget = CostModelBudget(k_max=33, max_depth=3, decay=1.0)
    plain, draft, gated_out = (False, 0, B, 0.0008), (True, 2, 2 * B, 0.006), (True, 0, B, 0.004)
    for drafting, forwards, verified, rest in [plain, draft, draft, gated_out] * 4:  # the first draft: a transition
        budget.observe_step(
            batch_size=B,
            target_tokens=verified,
            verified_tokens=verified,
            draft_forwards=forwards,
            draft_s=0.008 * forwards,
            verify_s=0.040,
            step_s=0.040 + 0.008 * forwards + rest,
            cap=33 if drafting else B,
        )
    assert budget.plain_rest.predict(B) == pytest.approx(0.0008)
    assert budget.rest.predict(B) == pytest.approx(0.006)
    assert budget.step_seconds(B, 0) == pytest.approx(0.0408)


def test_a_one_off_slow_step_does_not_hold_the_rest_high():
    """A server's first plain step paid a 58 ms allocation against a 1 ms rest: the model forgets
    it at the next step, and a later spike counts as 5 ms above the mean, not 58."""
    B = 8
    budget = CostModelBudget(k_max=33, max_depth=3, decay=1.0)
    for rest in (0.058, 0.001, 0.0012, 0.0008, 0.058, 0.001):
        budget.observe_step(
            batch_size=B, target_tokens=B, verified_tokens=B, draft_forwards=0, draft_s=0.0, verify_s=0.060,
            step_s=0.060 + rest, cap=B,
        )  # fmt: skip
    assert budget.plain_rest.predict(B) == pytest.approx((0.001 + 0.0012 + 0.0008 + 0.006 + 0.001) / 5)
