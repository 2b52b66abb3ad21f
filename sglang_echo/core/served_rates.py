"""The cost budget's served A/B test: plain and drafting steps' committed tokens per unit of time
(:class:`RealisedRates`), whose verdict overrules the cost model of :mod:`.budget`."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from typing import Optional

from .cost_curve import half_octave


class RealisedRates:
    """Committed tokens per request per unit of time, as served, for plain and drafting steps per
    batch-size bucket (half-octaves, as :class:`~.cost_curve.CostCurve`'s): the A/B test behind
    the veto in :meth:`~.budget.CostModelBudget.cap`. Per request, and in units of ``unit(B)``
    (the budget's predicted plain step at each step's size), so that a bucket's sizes compare: in
    seconds, a plain step at 76 requests (compute-bound) commits a third fewer tokens per request
    per second than one at 54 in the same bucket, and a batch shrinking through the bucket drafts
    only at its smaller sizes (``B < K_max``).

    Steps are kept in seconds and converted with the unit as it stands when a rate is asked for.
    The unit is a model still learning: converted when served, the first steps at a new load
    were divided by a plain step predicted from other sizes (at 8 requests, from one request's
    curve), were off by a factor of four, and outweighed the later ones for twenty steps.

    Single steps are noisy (a CPU step's time varies by a third from one to the next), so each arm
    remembers its last ``window`` steps, and the served rates give a verdict only where they
    differ by more than ``margin``: closer than that they cannot tell the arms apart, and the
    model decides. Drafting must lead by ``premium`` (at least ``margin``) for a verdict of its
    own, the costs of drafting no single step shows (:class:`~.budget.CostModelBudget`). Past
    ``decisive`` for drafting the budget probes plain decoding less often.

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
        premium: float = 0.0,
    ) -> None:
        self.window, self.min_samples, self.margin, self.decisive = window, min_samples, margin, decisive
        self.premium = premium
        self.outlier, self.stale = outlier, stale
        self.unit = unit or (lambda batch_size: 1.0)  # default: seconds
        # (bucket, arm) -> its last steps: (B, tokens per request, seconds)
        self._steps: dict[tuple[int, str], deque[tuple[int, float, float]]] = {}
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

    def _arm(self, batch_size: int, arm: str) -> deque[tuple[int, float, float]]:
        return self._steps.setdefault((half_octave(batch_size), arm), deque(maxlen=self.window))

    def add(self, batch_size: int, arm: str, committed: int, seconds: float) -> None:
        """One step of ``arm`` at ``batch_size`` that committed ``committed`` tokens in ``seconds``."""
        self._arm(batch_size, arm).append((batch_size, committed / batch_size, seconds))

    def samples(self, batch_size: int, arm: str) -> int:
        return len(self._steps.get((half_octave(batch_size), arm), ()))

    def rate(self, batch_size: int, arm: str) -> Optional[float]:
        """Tokens per request per unit (None until ``min_samples`` steps were seen, or while the
        unit is unknown at one of their sizes). A step ``outlier`` times the arm's median time is
        left out: a cold one (:class:`CostCurve`'s ``outlier``), not what the arm costs."""
        if self.samples(batch_size, arm) < self.min_samples:
            return None
        steps = self._steps[(half_octave(batch_size), arm)]
        units = {B: self.unit(B) for B in {B for B, *_ in steps}}
        if min(units.values()) <= 0:
            return None
        typical = statistics.median(seconds / units[B] for B, _, seconds in steps)
        kept = [(B, tokens, seconds) for B, tokens, seconds in steps if seconds / units[B] <= self.outlier * typical]
        return sum(tokens for _, tokens, _ in kept) / sum(seconds / units[B] for B, _, seconds in kept)

    def arms(self, batch_size: int) -> tuple[Optional[float], Optional[float]]:
        """``(plain, draft)`` rates at this load, for several verdicts on one step's figures."""
        return self.rate(batch_size, "plain"), self.rate(batch_size, "draft")

    def verdict(
        self,
        batch_size: int,
        margin: Optional[float] = None,
        arms: Optional[tuple[Optional[float], Optional[float]]] = None,
        premium: Optional[float] = None,
    ) -> Optional[str]:
        """The arm that committed more tokens per second at this load by more than ``margin``
        (default ``self.margin``; drafting by more than ``premium`` too, default ``self.premium``;
        None until both are measured, or while they are that close); ``arms``: :meth:`arms` at
        this load, when the caller has them."""
        plain, draft = arms or self.arms(batch_size)
        margin = self.margin if margin is None else margin
        premium = self.premium if premium is None else premium
        if plain is None or draft is None:
            return None
        if draft > plain * (1 + max(margin, premium)):
            return "draft"
        return "plain" if plain > draft * (1 + margin) else None
