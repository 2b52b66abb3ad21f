"""Costs against sizes as measured while serving: the curves behind the cost budget
(:mod:`sglang_echo.core.budget`). Exponentially weighted, so they follow the load; per
half-octave of the size, so they keep Eq. 2's flat-then-linear verify shape."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional


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

    def __init__(
        self, decay: float = 0.98, unit: float = 1.0, outlier: Optional[float] = None, slack: float = 0.0
    ) -> None:
        """``outlier`` (times, for timings): a sample that far above its bucket's mean counts as
        that bound; one that far below it restarts the bucket (see :meth:`add`). ``slack`` (in y's
        unit): a sample within it of the mean is never an outlier, for costs near 0 whose ratios
        mean nothing (0.1 ms against 1 ms)."""
        self.decay, self.unit = decay, unit  # unit: the smallest x told apart (x <= unit share a bucket)
        self.outlier, self.slack = outlier, slack
        self.line = LineFit(decay)
        self._buckets: dict[int, list[float]] = {}  # round(2 log2 x) -> [w, wx, wy]
        self._joined: Optional[tuple[list[float], list[float], float]] = None  # (xs, ys, slope) until add

    def add(self, x: float, y: float) -> None:
        """One sample. With ``outlier`` set, a time ``outlier`` times its bucket's mean (and more
        than ``slack`` above it) counts as that bound, and one ``outlier`` times below it (and more
        than ``slack`` below) starts the bucket afresh: a process's first steps run cold (kernel
        selection, first-touch memory, servers starting beside it) at 3-4 s against 40 ms, and an
        exponentially weighted mean seeded by one such step stayed 4 times too high for twenty
        steps."""
        key = half_octave(x / self.unit)
        b = self._buckets.get(key)
        if self.outlier is not None and b is not None and b[0] > 0:
            mean = b[2] / b[0]
            if y * self.outlier < mean and mean - y > self.slack:
                b = None  # the bucket's mean was cold
            else:
                y = min(y, max(self.outlier * mean, mean + self.slack))
        if b is None:
            b = self._buckets[key] = [0.0, 0.0, 0.0]
        self.line.add(x, y)
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
