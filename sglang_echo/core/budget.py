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
* ``t_rest(B)``: the rest of the step (draft extend, bookkeeping), the same for every D.

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
  and ``t_rest(B)`` are measured where the alternative would run; while the served rates say
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
more, steps draft even if the model says not to, at ``K_max(B)`` if the model sees no gain at
all. A model fitted across loads and workloads can be wrong in ways no single curve shows; the
served rates cannot, up to noise.

A drafting step right after a plain one is a transition: the drafter's state is cold and it
catches up what the plain steps deferred. Its time is not what steady drafting costs (served at
one request, such a step took two to four plain steps' time, a steady one 1.3), so it measures
neither ``t_draft``, the rest of the step, nor the drafting side of the A/B test; a burst
(``explore_burst``) leaves its other steps to measure drafting as it runs when chosen.

Deferred work is charged to the side that deferred it. A plain step may skip the draft extend
(the worker's lazy extend) and leave its pairs for the next drafting step to catch up; that
catch-up (``catch_up_s``) is plain decoding's cost, so it counts against the plain arm of the
A/B test and is left out of ``t_draft`` and of the drafting step's served rate. Charged to
drafting, every probe of drafting after a run of plain steps would pay the whole run's extends,
and the verdict would favour plain decoding by construction.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional

from .cost_curve import CostCurve, half_octave
from .kmax import KMax


class RealisedRates:
    """Committed tokens per request per unit of time, as served, for plain and drafting steps per
    batch-size bucket (half-octaves, as :class:`CostCurve`'s): the A/B test behind the veto in
    :meth:`CostModelBudget.cap`. Per request, and in units of ``unit(B)`` (the budget's predicted
    plain step at each step's size), so that a bucket's sizes compare: in seconds, a plain step at
    76 requests (compute-bound) commits a third fewer tokens per request per second than one at
    54 in the same bucket, and a batch shrinking through the bucket drafts only at its smaller
    sizes (``B < K_max``).

    Steps are kept in seconds and converted with the unit as it stands when a rate is asked for.
    The unit is a model still learning: converted when served, the first steps at a new load
    were divided by a plain step predicted from other sizes (at 8 requests, from one request's
    curve), were off by a factor of four, and outweighed the later ones for twenty steps.

    Single steps are noisy (a CPU step's time varies by a third from one to the next), so each arm
    remembers its last ``window`` steps, and the served rates give a verdict only where they
    differ by more than ``margin``: closer than that they cannot tell the arms apart, and the
    model decides. Past ``decisive`` for drafting the budget probes plain decoding less often.

    A load left for more than ``stale`` steps starts its test afresh (:meth:`visit`): its steps
    describe another time (a server's cold first steps, another workload), and converted with
    the unit of now, the few an arm keeps can decide a verdict that fresh steps then take a
    window to overturn, drafting at half plain decoding's speed meanwhile."""

    ARMS = ("plain", "draft")

    def __init__(
        self,
        window: int = 20,
        min_samples: int = 3,
        margin: float = 0.05,
        decisive: float = 0.25,
        outlier: float = 4.0,
        stale: int = 256,
        unit: Optional[Callable[[int], float]] = None,
    ) -> None:
        self.window, self.min_samples, self.margin, self.decisive = window, min_samples, margin, decisive
        self.outlier, self.stale = outlier, stale
        self.unit = unit or (lambda batch_size: 1.0)  # default: seconds
        # (bucket, arm) -> its last steps: [B, tokens per request, seconds, seconds charged to it]
        self._steps: dict[tuple[int, str], deque[list]] = {}
        self._clock = 0  # steps visited
        self._visited: dict[int, int] = {}  # bucket -> the clock at its last step

    def visit(self, batch_size: int) -> None:
        """A step is served at this load: its bucket's steps are forgotten if it was left for more
        than ``stale`` steps (the class docstring)."""
        self._clock += 1
        bucket = half_octave(batch_size)
        if self._clock - self._visited.get(bucket, self._clock) > self.stale:
            for arm in self.ARMS:
                self._steps.pop((bucket, arm), None)
        self._visited[bucket] = self._clock

    def _arm(self, batch_size: int, arm: str) -> deque[list]:
        return self._steps.setdefault((half_octave(batch_size), arm), deque(maxlen=self.window))

    def add(self, batch_size: int, arm: str, committed: int, seconds: float) -> None:
        """One step of ``arm`` at ``batch_size`` that committed ``committed`` tokens in ``seconds``."""
        self._arm(batch_size, arm).append([batch_size, committed / batch_size, seconds, 0.0])

    def charge(self, batch_size: int, arm: str, seconds: float) -> None:
        """Time ``arm`` cost at this load outside its own steps (no step, no tokens): plain
        decoding's deferred draft extends, caught up by a later drafting step. It goes to the
        arm's latest step here, and leaves the window with it (as a step of its own, one charge
        after every plain probe pushed the plain steps out); with no step here it is dropped."""
        steps = self._steps.get((half_octave(batch_size), arm))
        if steps:
            steps[-1][3] += seconds

    def samples(self, batch_size: int, arm: str) -> int:
        return len(self._steps.get((half_octave(batch_size), arm), ()))

    def rate(self, batch_size: int, arm: str) -> Optional[float]:
        """Tokens per request per unit (None until ``min_samples`` steps were seen, or while the
        unit is unknown at one of their sizes). A step ``outlier`` times the arm's median time is
        left out, with what was charged to it: a cold one (:class:`CostCurve`'s ``outlier``), not
        what the arm costs."""
        if self.samples(batch_size, arm) < self.min_samples:
            return None
        steps = self._steps[(half_octave(batch_size), arm)]
        units = {B: self.unit(B) for B in {B for B, *_ in steps}}
        if min(units.values()) <= 0:
            return None
        typical = statistics.median(seconds / units[B] for B, _, seconds, _ in steps)
        kept = [step for step in steps if step[2] / units[step[0]] <= self.outlier * typical]
        committed = sum(tokens for _, tokens, _, _ in kept)
        return committed / sum((seconds + charged) / units[B] for B, _, seconds, charged in kept)

    def arms(self, batch_size: int) -> tuple[Optional[float], Optional[float]]:
        """``(plain, draft)`` rates at this load, for several verdicts on one step's figures."""
        return self.rate(batch_size, "plain"), self.rate(batch_size, "draft")

    def verdict(
        self,
        batch_size: int,
        margin: Optional[float] = None,
        arms: Optional[tuple[Optional[float], Optional[float]]] = None,
    ) -> Optional[str]:
        """The arm that committed more tokens per second at this load by more than ``margin``
        (default ``self.margin``; None until both are measured, or while they are that close);
        ``arms``: :meth:`arms` at this load, when the caller has them."""
        plain, draft = arms or self.arms(batch_size)
        margin = self.margin if margin is None else margin
        if plain is None or draft is None:
            return None
        if draft > plain * (1 + margin):
            return "draft"
        return "plain" if plain > draft * (1 + margin) else None


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
    ) -> None:
        """``k_max``: the ceiling of every step's cap, fixed or growing with the batch (:class:`KMax`);
        ``max_depth``: the deepest tree (draft forwards per step); ``max_drafts``: the most drafts a
        request's tree can hold (the allowances ``D`` the model weighs; default ``max_depth``, a
        chain's), e.g. ``w_def * max_depth + w_max`` for Alg. 1's trees."""
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
        ):
            raise ValueError(
                f"need max_depth >= 0, warmup >= 0, explore_every >= 2, explore_backoff >= 1, "
                f"1 <= explore_burst < explore_every, plain_every >= 2; got max_depth={max_depth} "
                f"warmup={warmup} explore_every={explore_every} explore_backoff={explore_backoff} "
                f"explore_burst={explore_burst} plain_every={plain_every}"
            )
        self.k_max, self.max_depth = ceiling or KMax(k_max), max_depth
        self.max_drafts = max(max_depth, max_drafts or 0)
        self.padded_width = padded_width  # None: ragged verify (the target computes sum K_i tokens)
        self.warmup, self.explore_every, self.plain_every, self.decay = warmup, explore_every, plain_every, decay
        self.explore_backoff, self.explore_burst = explore_backoff, explore_burst
        self.free_share = free_share  # verify time a step may add for free tokens (see cap)
        self.verify = CostCurve(decay, outlier=4.0)  # seconds vs target tokens
        self.draft = CostCurve(decay, outlier=4.0)  # seconds per draft forward vs batch size
        self.rest = CostCurve(decay)  # rest of the step vs batch size (a few ms, often near 0: no outlier bound)
        self.gain = CostCurve(decay, unit=1 / 8)  # G: accepted drafts per request vs drafted per request
        self.forwards = CostCurve(decay, unit=1 / 8)  # F: draft forwards per step vs drafted per request
        self.spend = CostCurve(decay, unit=1 / 8)  # S: drafted per request vs allowed per request
        self.rates = RealisedRates(unit=lambda B: self.step_seconds(B, 0))  # the served A/B test of the model's choice
        self.spec_steps = 0  # steps that drafted at least one depth
        self.steps = 0
        self._exploring: dict[int, Exploring] = {}  # batch-size bucket -> its exploration schedule
        self._arm: Optional[str] = None  # this step's side of the A/B test
        self._reason: Optional[str] = None  # why this step's side was chosen (one of REASONS)
        self._drafted_last = False  # whether the last step observed drafted (the next is no transition)
        self._probe_follow_up: Optional[int] = None  # the load whose drafting probe drafts once more
        self._sampled = -1  # warm-up and exploration steps so far (the allowance each takes in turn)
        # (B, drafted, arm, step seconds, catch-up seconds)
        self._pending: deque[tuple[int, float, Optional[str], float, float]] = deque(maxlen=8)

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

    def expected_rate(self, batch_size: int, depth: int) -> float:
        """Expected tokens per second of a step whose cap allows ``depth`` tokens per request (the objective)."""
        drafted = self.spent(depth)
        seconds = self._seconds(batch_size, drafted)
        return batch_size * (1.0 + self.expected_gain(drafted)) / seconds if seconds > 0 else 0.0

    def step_seconds(self, batch_size: int, depth: int) -> float:
        """Predicted seconds of a step whose cap allows ``depth`` tokens per request."""
        return self._seconds(batch_size, self.spent(depth))

    def _seconds(self, B: int, drafted: float) -> float:
        return (
            self.verify.predict(self.target_tokens(B * (1 + drafted), B))
            + self.draft_forwards(drafted) * self.draft.predict(B)
            + self.rest.predict(B)
        )

    def best_depth(self, batch_size: int) -> int:
        """D*: the tokens per request to allow with the highest expected tokens per second."""
        rates = [self.expected_rate(batch_size, d) for d in range(self.max_drafts + 1)]
        return max(range(len(rates)), key=lambda d: (rates[d], -d))  # ties: the shallower

    # -- the worker's calls ----------------------------------------------------------------------
    # Why a step drafted or not: ``warmup`` / ``explore`` (sampling steps that keep the model
    # measuring), ``model`` (the cost model chose), ``measured`` (the served rates chose),
    # ``probe`` (the side not chosen, sampled), ``full`` (B >= K_max: no room to draft).
    REASONS = ("warmup", "explore", "model", "measured", "probe", "full")

    def cap(self, batch_size: int) -> int:
        """This step's verification cap, roots included (``<= max(K_max(B), B)``)."""
        self.steps += 1
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
        depth = self.best_depth(B)
        arms = self.rates.arms(B)  # once a step: each rate converts its window's steps
        verdict = self.rates.verdict(B, arms=arms)  # the served A/B test overrules the model, either way
        drafting = verdict == "draft" if verdict is not None else depth > 0
        self._reason = "model" if verdict is None else "measured"
        if explore is not None:
            explore.judge(drafting, self.explore_every, self.explore_backoff * self.explore_every)
        follow_up, self._probe_follow_up = self._probe_follow_up == half_octave(B), None
        if follow_up and not drafting:  # a drafting probe's second step: its first was a transition
            self._reason, drafting = "probe", True
        elif (depth > 0 or drafting) and self._probing(B, arms):
            drafting, self._reason = not drafting, "probe"  # the other side's probe (module docstring)
            if drafting:
                self._probe_follow_up = half_octave(B)
        self._arm = "draft" if drafting else "plain"
        if not drafting:
            return min(k_max, B)
        if depth == 0:  # the model sees no gain where the served rates do: draft as those steps did
            return k_max
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
        t_draft, rest = 1e3 * self.draft.predict(batch_size), 1e3 * self.rest.predict(batch_size)
        return (
            f"B={batch_size} model tok/s {model} (G(D{self.max_drafts})={gain:.2f}, t_draft={t_draft:.1f} ms, "
            f"rest={rest:.1f} ms); served tokens/request/plain-step {served}; "
            f"verdict {self.rates.verdict(batch_size)}; next exploration in {self.explore_gap(batch_size)} steps"
        )

    def explore_gap(self, batch_size: int) -> int:
        """Steps at this load (batch-size half-octave) from one exploration to the next."""
        explore = self._exploring.get(half_octave(batch_size))
        return self.explore_every if explore is None else explore.gap

    def _probing(self, batch_size: int, arms: tuple[Optional[float], Optional[float]]) -> bool:
        """Whether this step runs the side the decision did not pick: every ``plain_every``-th
        step (off the exploration steps), every 4th while that side has too few samples here,
        every ``4 * plain_every``-th plain one while drafting clearly pays."""
        every = self.plain_every
        if min(self.rates.samples(batch_size, arm) for arm in RealisedRates.ARMS) < self.rates.min_samples:
            every = min(every, 4)
        elif self.rates.verdict(batch_size, self.rates.decisive, arms) == "draft":
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
        catch_up_s: float = 0.0,
    ) -> Optional[tuple[str, str]]:
        """One decode step: its size, the tokens it verified (sum K_i, roots included), wall
        seconds by phase (``draft_s``: drafting and control; ``step_s``: the whole step;
        ``catch_up_s``: the part of ``draft_s`` that extended pairs earlier plain steps deferred,
        charged to plain decoding, see the module docstring), and the cap it was given (None: not
        known, ``S`` is not measured).

        Returns the step's decision ``(arm, reason)`` (``arm``: ``draft`` or ``plain``; ``reason``:
        one of :attr:`REASONS`), None for a step no :meth:`cap` decided."""
        decision = None if self._arm is None else (self._arm, self._reason)
        if batch_size <= 0:
            return decision
        catch_up_s = min(max(catch_up_s, 0.0), draft_s)
        draft_s, step_s = draft_s - catch_up_s, step_s - catch_up_s
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
        else:  # no draft depth: drafting was setup only, part of the step's fixed rest
            self.rest.add(batch_size, max(step_s - verify_s, 0.0))
        self._drafted_last = draft_forwards > 0
        self._pending.append((batch_size, drafted, arm, step_s, catch_up_s))
        self._arm = self._reason = None
        return decision

    def observe_accept(self, accepted_drafts: Sequence[int]) -> None:
        """Accepted drafts per request of the oldest step not yet matched (bonus token excluded)."""
        if not self._pending:
            return
        batch_size, drafted, arm, step_s, catch_up_s = self._pending.popleft()
        if batch_size != len(accepted_drafts):
            return  # not the batch that step drafted for: nothing to learn from it
        if arm is not None:  # None: no side decided, or a transition (module docstring)
            self.rates.add(batch_size, arm, batch_size + sum(accepted_drafts), step_s)
        if catch_up_s > 0:  # plain decoding's deferred extends, whoever caught them up
            self.rates.charge(batch_size, "plain", catch_up_s)
        if drafted > 0:
            self.gain.add(drafted, sum(accepted_drafts) / batch_size)
