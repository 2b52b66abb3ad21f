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
  a load (batch-size half-octave) after, a step whose batch leaves room for a draft per request
  (``2B <= K_max(B)``) gets the full ``K_max(B)``, so ``G``, ``F`` and ``t_draft`` keep being
  measured while the model says not to speculate. Such a step is the dearest there is, so while
  explorations keep confirming plain decoding at a load its interval doubles, up to
  ``explore_backoff`` times ``explore_every``; a verdict for drafting there resets it. Each load
  keeps its own schedule, so a batch shrinking through the half-octaves does not restart it;
* while the model says to speculate, every ``plain_every``-th step is plain, so ``T_verify(B)``
  and ``t_rest(B)`` are measured where the alternative would run.

The model predicts; :class:`RealisedRates` checks. The plain probes and the drafting steps
around them are an A/B test of the model's choice at the current load: the tokens each step
committed per request, against its time in units of the predicted plain step at its size, per
batch-size bucket. Where drafting has measurably committed fewer than plain decoding, steps are
plain (and every ``plain_every``-th drafts, so the verdict can change); where it has committed
more, steps draft even if the model says not to, at ``K_max(B)`` if the model sees no gain at
all. A model fitted across loads and workloads can be wrong in ways no single curve shows; the
served rates cannot, up to noise.

Deferred work is charged to the side that deferred it. A plain step may skip the draft extend
(the worker's lazy extend) and leave its pairs for the next drafting step to catch up; that
catch-up (``catch_up_s``) is plain decoding's cost, so it counts against the plain arm of the
A/B test and is left out of ``t_draft`` and of the drafting step's served rate. Charged to
drafting, every probe of drafting after a run of plain steps would pay the whole run's extends,
and the verdict would favour plain decoding by construction.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

from .kmax import KMax


@dataclass
class LineFit:
    """``y ~ a + b x`` by exponentially weighted least squares, with ``a, b >= 0``.

    With too little spread in x to see a slope it predicts the weighted mean of y (flat)."""

    decay: float = 0.98
    _s: list[float] = field(default_factory=lambda: [0.0] * 5)  # sum w, wx, wy, wxx, wxy

    def add(self, x: float, y: float) -> None:
        s, g = self._s, self.decay
        for i, v in enumerate((1.0, x, y, x * x, x * y)):
            s[i] = g * s[i] + v

    def slope(self) -> float:
        w, sx, sy, sxx, sxy = self._s
        if w <= 0:
            return 0.0
        mx, my = sx / w, sy / w
        var = sxx / w - mx * mx
        return 0.0 if var <= 1e-9 * max(1.0, mx * mx) else max((sxy / w - mx * my) / var, 0.0)

    def predict(self, x: float) -> float:
        w, sx, sy, sxx, sxy = self._s
        if w <= 0:
            return 0.0
        slope = self.slope()
        intercept = sy / w - slope * sx / w
        if intercept < 0:  # costs cannot be negative at x = 0: refit through the origin
            return max(sxy / sxx, 0.0) * x if sxx > 0 else sy / w
        return intercept + slope * x


def half_octave(x: float) -> int:
    """The bucket of a size: sizes within a factor of about 1.4 share one (sizes <= 1 share 0)."""
    return round(2 * math.log2(max(x, 1.0)))


class CostCurve:
    """A cost against a size, as measured: exponentially weighted means per half-octave of x,
    joined piecewise-linearly (and made non-decreasing: :func:`isotonic`), extended past the measured range with a
    :class:`LineFit`'s slope over all samples.

    A single line would miss Eq. 2's knee: on a CPU a verify of 1 or 8 tokens costs about the
    same, while the slope over 1..256 tokens charges every token alike."""

    def __init__(self, decay: float = 0.98, unit: float = 1.0) -> None:
        self.decay, self.unit = decay, unit  # unit: the smallest x told apart (x <= unit share a bucket)
        self.line = LineFit(decay)
        self._buckets: dict[int, list[float]] = {}  # round(2 log2 x) -> [w, wx, wy]
        self._joined: Optional[tuple[list[float], list[float], float]] = None  # (xs, ys, slope) until add

    def add(self, x: float, y: float) -> None:
        self.line.add(x, y)
        b = self._buckets.setdefault(half_octave(x / self.unit), [0.0, 0.0, 0.0])
        for i, v in enumerate((1.0, x, y)):
            b[i] = self.decay * b[i] + v
        self._joined = None

    def _points(self) -> tuple[list[float], list[float], float]:
        """The joined curve, rebuilt only after an add (a step's cap queries it many times)."""
        if self._joined is None:
            pts = sorted((wx / w, wy / w, w) for w, wx, wy in self._buckets.values())
            self._joined = ([p[0] for p in pts], isotonic([p[1] for p in pts], [p[2] for p in pts]), self.line.slope())
        return self._joined

    @property
    def measured(self) -> bool:
        return bool(self._buckets)

    def from_origin(self, x: float) -> float:
        """A yield-like curve: 0 at ``x <= 0``, linear from there to the first measured point,
        measured, then flat past the last (no evidence, no credit)."""
        xs, ys, _ = self._points()
        if not xs or x <= 0:
            return 0.0
        return ys[0] * x / xs[0] if x < xs[0] else self.clamped(x)

    def clamped(self, x: float) -> float:
        """The measured curve, flat outside the measured range."""
        xs, ys, _ = self._points()
        if not xs:
            return 0.0
        return ys[0] if x <= xs[0] else ys[-1] if x >= xs[-1] else self.predict(x)

    def predict(self, x: float) -> float:
        xs, ys, slope = self._points()
        if not xs:
            return 0.0
        if x <= xs[0]:
            return max(ys[0] - slope * (xs[0] - x), 0.0)
        if x >= xs[-1]:
            return ys[-1] + slope * (x - xs[-1])
        i = bisect.bisect_right(xs, x)
        t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
        return ys[i - 1] + t * (ys[i] - ys[i - 1])


def isotonic(ys: Sequence[float], weights: Sequence[float]) -> list[float]:
    """The non-decreasing sequence closest to ``ys`` in weighted least squares (pool adjacent
    violators). A cost cannot fall with size, but a measured one does (noise); pooling keeps one
    slow step, weighted as one, from raising every larger size to its time, as a running maximum
    would."""
    blocks: list[list[float]] = []  # [mean, weight, count], means increasing
    for y, w in zip(ys, weights):
        blocks.append([y, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            y2, w2, n2 = blocks.pop()
            b = blocks[-1]
            b[0], b[1], b[2] = (b[0] * b[1] + y2 * w2) / (b[1] + w2), b[1] + w2, b[2] + n2
    return [b[0] for b in blocks for _ in range(b[2])]


class RealisedRates:
    """Committed tokens per request per unit of time, as served, for plain and drafting steps per
    batch-size bucket (half-octaves, as :class:`CostCurve`'s): the A/B test behind the veto in
    :meth:`CostModelBudget.cap`. Per request, and the budget passes times in units of its
    predicted plain step at each step's size, so that a bucket's sizes compare: in seconds, a
    plain step at 76 requests (compute-bound) commits a third fewer tokens per request per second
    than one at 54 in the same bucket, and a batch shrinking through the bucket drafts only at its
    smaller sizes (``B < K_max``).

    Single steps are noisy (a CPU step's time varies by a third from one to the next), so each arm
    remembers about its last 20 steps (``decay``), and the served rates give a verdict only where
    they differ by more than ``margin``: closer than that they cannot tell the arms apart, and the
    model decides."""

    ARMS = ("plain", "draft")

    def __init__(self, decay: float = 0.95, min_samples: int = 3, margin: float = 0.05) -> None:
        self.decay, self.min_samples, self.margin = decay, min_samples, margin
        self._sums: dict[tuple[int, str], list[float]] = {}  # (bucket, arm) -> [w, w tokens/B, w seconds, n]

    def add(self, batch_size: int, arm: str, committed: int, seconds: float) -> None:
        """One step of ``arm`` at ``batch_size`` that committed ``committed`` tokens in ``seconds``
        (any unit, the same for both arms)."""
        s = self._sums.setdefault((half_octave(batch_size), arm), [0.0, 0.0, 0.0, 0])
        for i, v in enumerate((1.0, committed / batch_size, seconds)):
            s[i] = self.decay * s[i] + v
        s[3] += 1

    def charge(self, batch_size: int, arm: str, seconds: float) -> None:
        """Time ``arm`` cost at this load outside its own steps (no step, no tokens): plain
        decoding's deferred draft extends, caught up by a later drafting step."""
        self._sums.setdefault((half_octave(batch_size), arm), [0.0, 0.0, 0.0, 0])[2] += seconds

    def samples(self, batch_size: int, arm: str) -> int:
        s = self._sums.get((half_octave(batch_size), arm))
        return 0 if s is None else int(s[3])

    def rate(self, batch_size: int, arm: str) -> Optional[float]:
        """Tokens per second per request (None until ``min_samples`` steps were seen)."""
        s = self._sums.get((half_octave(batch_size), arm))
        return s[1] / s[2] if s is not None and s[3] >= self.min_samples and s[2] > 0 else None

    def verdict(self, batch_size: int) -> Optional[str]:
        """The arm that committed more tokens per second at this load by more than ``margin``
        (None until both are measured, or while they are that close)."""
        plain, draft = self.rate(batch_size, "plain"), self.rate(batch_size, "draft")
        if plain is None or draft is None:
            return None
        if draft > plain * (1 + self.margin):
            return "draft"
        return "plain" if plain > draft * (1 + self.margin) else None


@dataclass
class Exploring:
    """One load's exploration schedule (a batch-size half-octave), in steps served at that load,
    so that a batch shrinking through the half-octaves as its requests finish (a wave) does not
    start every load's schedule over, as one schedule for all loads did."""

    gap: int  # steps at this load from one exploration to the next
    since: int = 0  # steps at this load since its last exploration
    judging: bool = False  # an exploration ran here and no decision has followed it yet

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
        if max_depth < 0 or warmup < 0 or explore_every < 2 or explore_backoff < 1 or plain_every < 2:
            raise ValueError(
                f"need max_depth >= 0, warmup >= 0, explore_every >= 2, explore_backoff >= 1, "
                f"plain_every >= 2; got max_depth={max_depth} warmup={warmup} "
                f"explore_every={explore_every} explore_backoff={explore_backoff} "
                f"plain_every={plain_every}"
            )
        self.k_max, self.max_depth = ceiling or KMax(k_max), max_depth
        self.max_drafts = max(max_depth, max_drafts or 0)
        self.padded_width = padded_width  # None: ragged verify (the target computes sum K_i tokens)
        self.warmup, self.explore_every, self.plain_every, self.decay = warmup, explore_every, plain_every, decay
        self.explore_backoff = explore_backoff
        self.free_share = free_share  # verify time a step may add for free tokens (see cap)
        self.verify = CostCurve(decay)  # seconds vs target tokens
        self.draft = CostCurve(decay)  # seconds per draft forward vs batch size
        self.rest = CostCurve(decay)  # rest of the step vs batch size
        self.gain = CostCurve(decay, unit=1 / 8)  # G: accepted drafts per request vs drafted per request
        self.forwards = CostCurve(decay, unit=1 / 8)  # F: draft forwards per step vs drafted per request
        self.spend = CostCurve(decay, unit=1 / 8)  # S: drafted per request vs allowed per request
        self.rates = RealisedRates()  # the served A/B test of the model's choice
        self.spec_steps = 0  # steps that drafted at least one depth
        self.steps = 0
        self._exploring: dict[int, Exploring] = {}  # batch-size bucket -> its exploration schedule
        self._arm: Optional[str] = None  # this step's side of the A/B test
        self._reason: Optional[str] = None  # why this step's side was chosen (one of REASONS)
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
    # Why a step drafted or not: ``warmup`` / ``explore`` (K_max steps that keep the model
    # measuring), ``model`` (the cost model chose), ``measured`` (the served rates chose),
    # ``probe`` (the side not chosen, sampled), ``full`` (B >= K_max: no room to draft).
    REASONS = ("warmup", "explore", "model", "measured", "probe", "full")

    def cap(self, batch_size: int) -> int:
        """This step's verification cap, roots included (``<= max(K_max(B), B)``)."""
        self.steps += 1
        B = batch_size
        k_max = self.k_max(B)
        if B >= k_max:  # the roots alone fill K_max: a plain step whatever the model says
            self._arm, self._reason = "plain", "full"
            return k_max
        self._arm, self._reason = "draft", "warmup"  # warm-up and explorations draft at K_max: drafting samples
        # Both wait for a batch with room for a draft per request: with less they measure little,
        # and still pay the lazy extend's catch-up for every request (B x its backlog pairs).
        explore = None if 2 * B > k_max else self._exploring.setdefault(half_octave(B), Exploring(self.explore_every))
        if explore is not None:
            explore.since += 1
            if self.spec_steps < self.warmup:
                return k_max
            if explore.since >= explore.gap:
                explore.since, explore.judging, self._reason = 0, True, "explore"
                return k_max
        depth = self.best_depth(B)
        verdict = self.rates.verdict(B)  # the served A/B test overrules the model, either way
        drafting = verdict == "draft" if verdict is not None else depth > 0
        self._reason = "model" if verdict is None else "measured"
        if explore is not None:
            explore.judge(drafting, self.explore_every, self.explore_backoff * self.explore_every)
        if (depth > 0 or drafting) and self._probing(B):
            drafting, self._reason = not drafting, "probe"  # the other side's probe (module docstring)
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

    def _probing(self, batch_size: int) -> bool:
        """Whether this step runs the side the decision did not pick: every ``plain_every``-th
        step (off the exploration steps), every 4th while that side has too few samples here."""
        every = self.plain_every
        if min(self.rates.samples(batch_size, arm) for arm in RealisedRates.ARMS) < self.rates.min_samples:
            every = min(every, 4)
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
        if draft_forwards > 0:
            self.spec_steps += 1
            self.draft.add(batch_size, draft_s / draft_forwards)
            if drafted > 0:
                self.forwards.add(drafted, draft_forwards)
            self.rest.add(batch_size, max(step_s - verify_s - draft_s, 0.0))
        else:  # no draft depth: drafting was setup only, part of the step's fixed rest
            self.rest.add(batch_size, max(step_s - verify_s, 0.0))
        self._pending.append((batch_size, drafted, self._arm, step_s, catch_up_s))
        self._arm = self._reason = None
        return decision

    def observe_accept(self, accepted_drafts: Sequence[int]) -> None:
        """Accepted drafts per request of the oldest step not yet matched (bonus token excluded)."""
        if not self._pending:
            return
        batch_size, drafted, arm, step_s, catch_up_s = self._pending.popleft()
        if batch_size != len(accepted_drafts):
            return  # not the batch that step drafted for: nothing to learn from it
        plain_s = self.step_seconds(batch_size, 0)  # the unit that makes the bucket's sizes compare
        if arm is not None and plain_s > 0:
            self.rates.add(batch_size, arm, batch_size + sum(accepted_drafts), step_s / plain_s)
            if catch_up_s > 0:
                self.rates.charge(batch_size, "plain", catch_up_s / plain_s)
        if drafted > 0:
            self.gain.add(drafted, sum(accepted_drafts) / batch_size)
