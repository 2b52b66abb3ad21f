"""Each step's verification cap from costs measured while serving (ECHO Eq. 2-3, online).

Eq. 2 models verification as flat up to ``K_max``, "the computing limit of the hardware", and
linear beyond it, and ECHO spends that ``K_max`` every step. Where verification is compute-bound
from the first token (a CPU, or a small GPU under a large model) no fixed cap suits every load:
the one that pays at batch 1 makes batch 32 slower than plain decoding. :class:`CostModelBudget`
picks each step's cap ``K_step <= K_max(B)`` to maximise the step's expected tokens per second::

    D* = argmax_D  B (1 + G(s)) / (T_verify(n(B (1 + s))) + F(s) t_draft(B) + t_rest(B)),  s = S(D)
    K_step = min(K_max(B), B (1 + D*)), then raised (D* >= 1 only) while the verify pass grows by
             at most 2% of the step: tokens below Eq. 2's knee cost (almost) nothing

``D`` is the number of tokens per request the cap allows (``K_step = B (1 + D)``, Eq. 4's cap);
the policy (Algorithm 1) spends them as its gates say, so what a cap buys is measured on the
steps the policy actually ran, never derived from a uniform tree:

* ``S(D)``: tokens per request the policy drafted when the cap allowed ``D`` (``<= D``: the gates
  leave the rest unspent; flat outside the measured allowances);
* ``G(s)``: accepted drafts per request when ``s`` tokens per request were drafted, over the whole
  batch (``(sum K_i - B) / B``), not over the requests the gates let through;
* ``F(s)``: draft forwards per step at that ``s`` (the gates send confident requests deeper
  than ``s``);
* ``T_verify(n)``: the verify pass against ``n``, the tokens the target computes (the sum of
  K_i with ragged verify, B x W padded);
* ``t_draft(B)``: seconds per draft forward (or lookup round, with its control);
* ``t_rest(B)``: the rest of a drafting step (its draft extend, bookkeeping), the same for every
  ``D >= 1``; at ``D = 0``, that of a plain step, measured apart: it has no draft extend (the
  lazy extend defers it), and charged a drafting step's, plain decoding looks dearer than it is.

Each is a measured curve (:class:`CostCurve`: exponentially weighted means per half-octave of
its size, which keeps Eq. 2's flat-then-linear shape), so the model follows the load and the
workload. Between 0 (nothing drafted, nothing gained) and the first measured size ``G`` and
``F`` are interpolated linearly, which under-credits small ``s`` (acceptance falls with depth);
past the last measured size nothing more is credited. ``D* = 0`` is plain decoding.

Measuring both sides. A batch with no room to draft (``B >= K_max(B)``) is plain. A step only
measures the side it took, so both are probed at the current load:

* until ``warmup`` speculative steps have been seen, and every ``explore_every`` steps served at
  a load (batch-size half-octave) after, ``explore_burst`` steps in a row whose batch leaves room
  for a draft per request (``2B <= K_max(B)``) draft, so ``G``, ``F`` and ``t_draft`` keep being
  measured while the model says not to speculate. These sampling steps take the allowances
  ``K_max(B)``, then ``D_top / 2``, ``D_top / 4`` ... 1 in turn (``D_top``: the most a tree can
  spend), so ``G`` is measured where it is steepest: at K_max alone, eight requests drafted seven
  tokens each, ``G(1)`` was interpolated from the origin to a seventh of ``G(7)``, and one draft
  per request never looked worth its verify. Such steps are the dearest there are, so while
  explorations keep confirming plain decoding at a load its interval doubles, up to
  ``explore_backoff`` times ``explore_every``; a verdict for drafting there resets it. Each load
  keeps its own schedule, so a batch shrinking through the half-octaves does not restart it;
* while the model says to speculate, every ``plain_every``-th step is plain, so ``T_verify(B)``
  and plain steps' rest are measured where the alternative would run; while the served rates say
  plain and the model does not, every ``plain_every``-th step and the one after it draft. Where
  drafting commits more than ``1 + RealisedRates.decisive`` times plain decoding's served rate
  (1.4 times at one request here) a plain probe comes every ``4 * plain_every`` steps: each costs
  what drafting would have gained, the verdict is not in doubt, and a plain step's cost hardly
  changes with the workload. Drafting's side, which does, keeps the shorter period when it loses.

The model predicts; :class:`RealisedRates` checks. The plain probes and the drafting steps
around them are an A/B test of the model's choice at the current load: the tokens each step
committed per request, against its time in units of the predicted plain step at its size, per
batch-size bucket. Where drafting has measurably committed fewer than plain decoding, steps are
plain (and every ``plain_every``-th drafts, so the verdict can change); where it has committed
more, steps draft even if the model says not to, at the allowance the model ranks best among
the drafting ones. A model fitted across loads and workloads can be wrong in ways no single curve
shows; the served rates cannot, up to noise. Which allowance paid they do not say (the drafting
arm mixes every allowance the explorations sampled), and the model's ranking of allowances
rests on the same measured curves as its prediction: at 8 requests on a CPU it ranks one draft
per request (a 90 ms step) far above ``K_max(B)`` (160 ms, twice a plain step).

Drafting pays a premium. Both the model and the served rates choose drafting only where it
beats plain decoding by ``premium`` (10%) plus its prefill charge, for what drafting costs
beyond its own steps. The premium covers the transitions into it and the explorations; the
charge (:mod:`.prefill_share`, measured) the requests that finish apart and so are prefilled one
at a time instead of together, each a step the whole batch waits for. At 8 requests on a CPU,
drafting steps 3-6% ahead of plain ones per step served 4-10% fewer tokens per second than plain
decoding, and steps flipping between the two with the noise of a near tie served 16% fewer.

A drafting step right after a plain one is a transition: the drafter's state is cold and it
catches up the draft extends the plain steps deferred (the worker's lazy extend). Its time is
neither what steady drafting costs (served at one request, such a step took two to four plain
steps' time, a steady one 1.3) nor what steady plain decoding costs (which never extends), so it
measures neither ``t_draft``, the rest of the step, nor either side of the A/B test: switching
has its price, but not as either side's rate. Charged to drafting, every probe of drafting
after a run of plain steps would pay the whole run's extends and the verdict would favour plain
decoding by construction; charged to plain decoding, each plain probe amid drafting steps would
pay the next step's catch-up (at 8 requests on a CPU, a draft forward on a 44 ms plain step)
and the verdict would favour drafting where it measurably lost. A burst (``explore_burst``)
leaves its other steps to measure drafting as it runs when chosen.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from .cost_curve import CostCurve, half_octave
from .kmax import KMax
from .prefill_share import PrefillShare
from .served_rates import RealisedRates

REST_SLACK_S = 5e-3  # t_rest samples within 5 ms of their mean are never outliers (CostCurve.slack)


@dataclass
class Exploring:
    """One load's exploration schedule (a batch-size half-octave), in steps served at that load,
    so that a batch shrinking through the half-octaves as its requests finish (a wave) does not
    start every load's schedule over, as one schedule for all loads did."""

    gap: int  # steps at this load from one exploration to the next
    since: int = 0  # steps at this load since its last exploration
    judging: bool = False  # an exploration ran here and no decision has followed it yet
    left: int = 0  # steps of the running exploration burst still to draft

    def judge(self, drafting: bool, shortest: int, longest: int) -> None:
        """The first decision after an exploration judges it: plain decoding again doubles the
        gap (up to ``longest``); drafting, at any time, brings it back to ``shortest``."""
        if drafting:
            self.gap = shortest
        elif self.judging:
            self.gap = min(2 * self.gap, longest)
        self.judging = False


class CostModelBudget:
    """Chooses each decode step's verification cap (see the module docstring).

    The worker calls :meth:`cap` before drafting, :meth:`observe_step` with the step's timing,
    and :meth:`observe_accept` with the verify result; accept results are matched to the drafts
    they verified in order (overlap scheduling reports them one step late).
    """

    def __init__(
        self,
        k_max: int | KMax,
        max_depth: int,
        *,
        padded_width: Optional[int] = None,
        warmup: int = 16,
        explore_every: int = 64,
        explore_backoff: int = 16,
        explore_burst: int = 4,
        plain_every: int = 16,
        decay: float = 0.98,
        free_share: float = 0.02,
        max_drafts: Optional[int] = None,
        premium: float = 0.10,
    ) -> None:
        """``k_max``: the ceiling of every step's cap, fixed or growing with the batch (:class:`KMax`);
        ``max_depth``: the deepest tree (draft forwards per step); ``max_drafts``: the most drafts a
        request's tree can hold (the allowances ``D`` the model weighs; default ``max_depth``, a
        chain's), e.g. ``w_def * max_depth + w_max`` for Alg. 1's trees; ``premium``: the lead
        over plain decoding, predicted or served, that drafting needs to be chosen (the module
        docstring)."""
        ceiling = k_max if isinstance(k_max, KMax) else None
        if ceiling is None and (isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 1):
            raise ValueError(f"need k_max >= 1, got k_max={k_max}")
        if (
            max_depth < 0
            or warmup < 0
            or explore_every < 2
            or explore_backoff < 1
            or not 1 <= explore_burst < explore_every
            or plain_every < 2
            or premium < 0
        ):
            raise ValueError(
                f"need max_depth >= 0, warmup >= 0, explore_every >= 2, explore_backoff >= 1, "
                f"1 <= explore_burst < explore_every, plain_every >= 2, premium >= 0; got max_depth={max_depth} "
                f"warmup={warmup} explore_every={explore_every} explore_backoff={explore_backoff} "
                f"explore_burst={explore_burst} plain_every={plain_every} premium={premium}"
            )
        self.k_max, self.max_depth = ceiling or KMax(k_max), max_depth
        self.max_drafts = max(max_depth, max_drafts or 0)
        self.padded_width = padded_width  # None: ragged verify (the target computes sum K_i tokens)
        self.warmup, self.explore_every, self.plain_every, self.decay = warmup, explore_every, plain_every, decay
        self.explore_backoff, self.explore_burst = explore_backoff, explore_burst
        self.free_share = free_share  # verify time a step may add for free tokens (see cap)
        self.verify = CostCurve(decay, outlier=4.0)  # seconds vs target tokens
        self.draft = CostCurve(decay, outlier=4.0)  # seconds per draft forward vs batch size
        # The rest of the step vs batch size, drafting steps' (with their draft extend) and plain
        # steps' apart: a few ms, often near 0, so bounded only beyond 5 ms of the mean, which
        # keeps a one-off spike (a buffer's first allocation: 58 ms against 1) out of the model.
        self.rest, self.plain_rest = (CostCurve(decay, outlier=4.0, slack=REST_SLACK_S) for _ in range(2))
        self.gain = CostCurve(decay, unit=1 / 8)  # G: accepted drafts per request vs drafted per request
        self.forwards = CostCurve(decay, unit=1 / 8)  # F: draft forwards per step vs drafted per request
        self.spend = CostCurve(decay, unit=1 / 8)  # S: drafted per request vs allowed per request
        # The served A/B test of the model's choice; its premium is the model's too (best_depth).
        self.rates = RealisedRates(unit=lambda B: self.step_seconds(B, 0), premium=premium)
        self.prefills = PrefillShare(decay)  # drafting's prefill charge, added to the premium
        self.spec_steps = 0  # steps that drafted at least one depth
        self.steps = 0
        self._exploring: dict[int, Exploring] = {}  # batch-size bucket -> its exploration schedule
        self._arm: Optional[str] = None  # this step's side of the A/B test
        self._reason: Optional[str] = None  # why this step's side was chosen (one of REASONS)
        self._drafted_last = False  # whether the last step observed drafted (the next is no transition)
        self._since_prefill = {"plain": 0, "draft": 0}  # decode steps since the last prefill, per arm
        self._prefill_arm: Optional[str] = None  # the arm the last prefill counted for
        self._last_batch: Optional[int] = None  # the last decode step's batch size
        self._probe_follow_up: Optional[int] = None  # the load whose drafting probe drafts once more
        self._sampled = -1  # warm-up and exploration steps so far (the allowance each takes in turn)
        self.last_premium: Optional[float] = None  # what this step's cap required of drafting (None: not weighed)
        # (B, drafted, arm, step seconds)
        self._pending: deque[tuple[int, float, Optional[str], float]] = deque(maxlen=8)

    # -- the model -----------------------------------------------------------------------------
    def spent(self, allowed: float) -> float:
        """``S(D)``: tokens per request the policy drafts when the cap allows ``allowed``."""
        if allowed <= 0 or not self.spend.measured:
            return max(allowed, 0.0)
        # Flat outside the measured range: a cap allowing less than the smallest one seen would be
        # spent up to what that one was (batch 1 warms up at K_max, spending 4 of 63 allowed).
        return min(allowed, self.spend.clamped(allowed))

    def expected_gain(self, drafted: float) -> float:
        """``G(D)``: accepted drafts per request when ``drafted`` tokens per request are drafted."""
        return self.gain.from_origin(drafted)

    def draft_forwards(self, drafted: float) -> float:
        """``F(D)``: draft forwards per step (at least one when anything is drafted)."""
        if drafted <= 0:
            return 0.0
        seen = self.forwards.from_origin(drafted) if self.forwards.measured else drafted
        return min(max(seen, 1.0), float(self.max_depth))

    def target_tokens(self, verified: float, batch_size: int) -> float:
        return verified if self.padded_width is None else batch_size * self.padded_width

    def reach(self, batch_size: int) -> float:
        """The most tokens per request a cap can allow at this batch, ``(K_max(B) - B) / B``: an
        allowance past it gets the cap ``K_max(B)`` (:meth:`cap`), so it is weighed as that."""
        return max(self.k_max(batch_size) - batch_size, 0) / batch_size

    def drafted(self, batch_size: int, depth: int) -> float:
        """Tokens per request drafted under an allowance of ``depth``: ``S`` of what the cap gives."""
        return self.spent(min(depth, self.reach(batch_size)))

    def expected_rate(self, batch_size: int, depth: int) -> float:
        """Expected tokens per second of a step whose cap allows ``depth`` tokens per request (the objective)."""
        drafted = self.drafted(batch_size, depth)
        seconds = self._seconds(batch_size, drafted)
        return batch_size * (1.0 + self.expected_gain(drafted)) / seconds if seconds > 0 else 0.0

    def step_seconds(self, batch_size: int, depth: int) -> float:
        """Predicted seconds of a step whose cap allows ``depth`` tokens per request."""
        return self._seconds(batch_size, self.drafted(batch_size, depth))

    def _seconds(self, B: int, drafted: float) -> float:
        return (
            self.verify.predict(self.target_tokens(B * (1 + drafted), B))
            + self.draft_forwards(drafted) * self.draft.predict(B)
            + self._rest(drafted > 0).predict(B)
        )

    def _rest(self, drafting: bool) -> CostCurve:
        """``t_rest``'s curve for a drafting or a plain step; the other's until it is measured (an
        unmeasured curve predicts 0 and would win the model's choice for its side)."""
        own, other = (self.rest, self.plain_rest) if drafting else (self.plain_rest, self.rest)
        return own if own.measured or not other.measured else other

    def best_depth(self, batch_size: int, premium: Optional[float] = None) -> int:
        """D*: the tokens per request to allow with the highest expected tokens per second, 0
        unless that beats plain decoding's by ``premium`` (default :meth:`premium` at this load)."""
        premium = self.premium(batch_size) if premium is None else premium
        best, plain = self.best_drafting_depth(batch_size), self.expected_rate(batch_size, 0)
        return best if self.expected_rate(batch_size, best) > (1 + premium) * plain else 0

    def premium(self, batch_size: int) -> float:
        """The lead over plain decoding that drafting needs at this load: ``premium`` plus its
        prefill charge (:mod:`.prefill_share`), which the steps themselves never show."""
        return self.rates.premium + self.prefills.charge(batch_size, self.step_seconds(batch_size, 0))

    def best_drafting_depth(self, batch_size: int) -> int:
        """The allowance ``D >= 1`` with the highest expected tokens per second (ties: the shallower)."""
        rates = {d: self.expected_rate(batch_size, d) for d in range(1, self.max_drafts + 1)}
        return max(rates, key=lambda d: (rates[d], -d), default=0)

    # -- the worker's calls ----------------------------------------------------------------------
    # Why a step drafted or not: ``warmup`` / ``explore`` (sampling steps that keep the model
    # measuring), ``model`` (the cost model chose), ``measured`` (the served rates chose),
    # ``probe`` (the side not chosen, sampled), ``full`` (B >= K_max: no room to draft).
    REASONS = ("warmup", "explore", "model", "measured", "probe", "full")

    def cap(self, batch_size: int) -> int:
        """This step's verification cap, roots included (``<= max(K_max(B), B)``)."""
        self.steps += 1
        self.last_premium = None
        B = batch_size
        self.rates.visit(B)
        k_max = self.k_max(B)
        if B >= k_max:  # the roots alone fill K_max: a plain step whatever the model says
            self._arm, self._reason = "plain", "full"
            return k_max
        self._arm, self._reason = "draft", "warmup"  # warm-up and explorations: drafting samples
        # Both wait for a batch with room for a draft per request: with less they measure little,
        # and still pay the lazy extend's catch-up for every request (B x its backlog pairs).
        explore = None if 2 * B > k_max else self._exploring.setdefault(half_octave(B), Exploring(self.explore_every))
        if explore is not None:
            explore.since += 1
            if self.spec_steps < self.warmup:
                return self._sampling_cap(B, k_max)
            if explore.since >= explore.gap:
                explore.since, explore.judging, explore.left = 0, True, self.explore_burst
            if explore.left > 0:
                explore.left -= 1
                self._reason = "explore"
                return self._sampling_cap(B, k_max)
        premium = self.last_premium = self.premium(B)  # once a step, for the model and the served rates
        depth = self.best_depth(B, premium)
        arms = self.rates.arms(B)  # once a step: each rate converts its window's steps
        verdict = self.rates.verdict(B, arms=arms, premium=premium)  # the served A/B test overrules the model
        drafting = verdict == "draft" if verdict is not None else depth > 0
        self._reason = "model" if verdict is None else "measured"
        if explore is not None:
            explore.judge(drafting, self.explore_every, self.explore_backoff * self.explore_every)
        follow_up, self._probe_follow_up = self._probe_follow_up == half_octave(B), None
        if follow_up and not drafting:  # a drafting probe's second step: its first was a transition
            self._reason, drafting = "probe", True
        elif (depth > 0 or drafting) and self._probing(B, arms, premium):
            drafting, self._reason = not drafting, "probe"  # the other side's probe (module docstring)
            if drafting:
                self._probe_follow_up = half_octave(B)
        self._arm = "draft" if drafting else "plain"
        if not drafting:
            return min(k_max, B)
        if depth == 0:  # the served rates see a gain the model does not: its best drafting allowance
            depth = self.best_drafting_depth(B)
        k = min(k_max, B * (1 + depth))
        if k >= k_max:
            return k
        # Below Eq. 2's knee verified tokens are (nearly) free: extend the cap while the verify
        # pass grows by at most `free_share` of the step, for Alg. 1 to spend (confident depth,
        # then width). Binary search: the verify curve is non-decreasing.
        limit = self.verify.predict(self.target_tokens(k, B)) + self.free_share * self.step_seconds(B, depth)
        lo, hi = k, k_max
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.verify.predict(self.target_tokens(mid, B)) <= limit:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _sampling_cap(self, B: int, k_max: int) -> int:
        """A warm-up or exploration step's cap: ``K_max(B)``, then the allowances ``D_top / 2``,
        ``D_top / 4`` ... 1 per request in turn (module docstring)."""
        top = min((k_max - B) // B, self.max_drafts)
        rungs = [k_max] + [B * (1 + (top >> i)) for i in range(1, top.bit_length())]
        self._sampled += 1
        return rungs[self._sampled % len(rungs)]

    def explain(self, batch_size: int) -> str:
        """The model's and the served rates' view of this load, one line (for a log): expected
        tokens per second per allowed depth, the served rates per arm, the verdict."""
        model = " ".join(f"D{d}:{self.expected_rate(batch_size, d):.1f}" for d in range(self.max_drafts + 1))
        served = " ".join(
            f"{arm}:{'-' if (r := self.rates.rate(batch_size, arm)) is None else f'{r:.3f}'}"
            f"(n={self.rates.samples(batch_size, arm)})"
            for arm in RealisedRates.ARMS
        )
        gain = self.expected_gain(self.spent(self.max_drafts))
        t_draft = 1e3 * self.draft.predict(batch_size)
        rest, plain_rest = (1e3 * self._rest(drafting).predict(batch_size) for drafting in (True, False))
        premium = self.premium(batch_size)
        batching = " ".join(
            f"{arm}:{'-' if (n := self.prefills.requests_per_prefill(arm, batch_size)) is None else f'{n:.1f}'}"
            for arm in RealisedRates.ARMS
        )
        return (
            f"B={batch_size} model tok/s {model} (G(D{self.max_drafts})={gain:.2f}, t_draft={t_draft:.1f} ms, "
            f"rest={rest:.1f} ms, plain rest={plain_rest:.1f} ms); served tokens/request/plain-step {served}; "
            f"premium {premium:.3f} (requests per prefill {batching}); "
            f"verdict {self.rates.verdict(batch_size, premium=premium)}; "
            f"next exploration in {self.explore_gap(batch_size)} steps"
        )

    def explore_gap(self, batch_size: int) -> int:
        """Steps at this load (batch-size half-octave) from one exploration to the next."""
        explore = self._exploring.get(half_octave(batch_size))
        return self.explore_every if explore is None else explore.gap

    def _probing(self, batch_size: int, arms: tuple[Optional[float], Optional[float]], premium: float) -> bool:
        """Whether this step runs the side the decision did not pick: every ``plain_every``-th
        step (off the exploration steps), every 4th while that side has too few samples here,
        every ``4 * plain_every``-th plain one while drafting clearly pays."""
        every = self.plain_every
        if min(self.rates.samples(batch_size, arm) for arm in RealisedRates.ARMS) < self.rates.min_samples:
            every = min(every, 4)
        elif self.rates.verdict(batch_size, self.rates.decisive, arms, premium) == "draft":
            every *= 4  # plain decoding's probes, while drafting clearly pays (module docstring)
        return self.steps % every == every // 2

    def observe_step(
        self,
        *,
        batch_size: int,
        target_tokens: int,
        verified_tokens: int,
        draft_forwards: int,
        draft_s: float,
        verify_s: float,
        step_s: float,
        cap: Optional[int] = None,
    ) -> Optional[tuple[str, str]]:
        """One decode step: its size, the tokens it verified (sum K_i, roots included), wall
        seconds by phase (``draft_s``: drafting and control; ``step_s``: the whole step), and the
        cap it was given (None: not known, ``S`` is not measured).

        Returns the step's decision ``(arm, reason)`` (``arm``: ``draft`` or ``plain``; ``reason``:
        one of :attr:`REASONS`), None for a step no :meth:`cap` decided."""
        decision = None if self._arm is None else (self._arm, self._reason)
        if batch_size <= 0:
            return decision
        self.verify.add(target_tokens, verify_s)
        drafted = max(verified_tokens - batch_size, 0) / batch_size
        if cap is not None and cap > batch_size:
            self.spend.add((cap - batch_size) / batch_size, drafted)
        arm = self._arm
        if draft_forwards > 0:
            self.spec_steps += 1
            if drafted > 0:
                self.forwards.add(drafted, draft_forwards)
            if self._drafted_last:
                self.draft.add(batch_size, draft_s / draft_forwards)
                self.rest.add(batch_size, max(step_s - verify_s - draft_s, 0.0))
            elif arm == "draft":
                arm = None  # a transition (module docstring): not the drafting side's steady cost
        elif verified_tokens <= batch_size and (cap is None or cap <= batch_size):
            # A plain step's rest. A step allowed to draft whose gates cut every tree is not one:
            # it paid the draft setup and the catch-up of deferred extends (4 ms a step at 8
            # requests on a CPU, against 0.8 for a plain step).
            self.plain_rest.add(batch_size, max(step_s - verify_s, 0.0))
        self._drafted_last = draft_forwards > 0
        self._since_prefill["draft" if self._drafted_last else "plain"] += 1
        self._last_batch = batch_size
        self._pending.append((batch_size, drafted, arm, step_s))
        self._arm = self._reason = None
        return decision

    def observe_prefill(self, requests: int, seconds: float) -> None:
        """One prefill batch of ``requests`` new requests that took ``seconds`` (the premium's
        prefill charge, :mod:`.prefill_share`), counted for the arm of most decode steps since the
        last prefill (back-to-back prefills: the same arm) at the last decode step's load."""
        since = self._since_prefill
        if since["plain"] or since["draft"]:
            self._prefill_arm = "draft" if since["draft"] > since["plain"] else "plain"
            since["plain"] = since["draft"] = 0
        self.prefills.observe_prefill(requests, seconds, arm=self._prefill_arm, load=self._last_batch)

    def observe_accept(self, accepted_drafts: Sequence[int]) -> None:
        """Accepted drafts per request of the oldest step not yet matched (bonus token excluded)."""
        self.prefills.observe_decoded(len(accepted_drafts) + sum(accepted_drafts))
        if not self._pending:
            return
        batch_size, drafted, arm, step_s = self._pending.popleft()
        if batch_size != len(accepted_drafts):
            return  # not the batch that step drafted for: nothing to learn from it
        if arm is not None:  # None: no side decided, or a transition (module docstring)
            self.rates.add(batch_size, arm, batch_size + sum(accepted_drafts), step_s)
        if drafted > 0:
            self.gain.add(drafted, sum(accepted_drafts) / batch_size)
