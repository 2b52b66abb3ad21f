"""Each step's verification cap from costs measured while serving (ECHO Eq. 2-3, online).

Eq. 2 models verification as flat up to ``K_max``, "the computing limit of the hardware", and
linear beyond it, and ECHO spends that fixed ``K_max`` every step. Where verification is
compute-bound from the first token (a CPU, or a small GPU under a large model) no fixed cap
works at every load: the one that pays at batch 1 makes batch 32 slower than plain decoding
(``benchmarks/results/serve-smollm2-drafters``). :class:`CostModelBudget` picks each step's cap
``K_step <= K_max`` so as to maximise the step's expected tokens per second::

    D* = argmax_D  B (1 + sum_{d <= D} a_d) / (T_verify(n(B (1 + D))) + D t_draft(B) + t_rest(B))
    K_step = min(K_max, B (1 + D*)), then raised (D* >= 1 only) while the verify pass grows by
             at most 2% of the step: tokens below Eq. 2's knee cost (almost) nothing

* ``a_d``: of the requests whose tree reached depth d, the share whose first d drafts were all
  accepted (ECHO's own trees, so the gates' selection is in it);
* ``T_verify(n)``: the verify pass against ``n``, the tokens the target computes (the sum of
  K_i with ragged verify, B x W padded);
* ``t_draft(B)``: seconds per draft depth (one draft forward or lookup round, with its control);
* ``t_rest(B)``: the rest of the step (draft extend, bookkeeping); it is the same for every D.

Each cost is a measured curve (:class:`CostCurve`: exponentially weighted means per half-octave
of its size, so Eq. 2's flat-then-linear shape is kept), and ``a_d`` decays too, so the model
follows the load and the workload. ``D* = 0`` is plain decoding: no draft tokens, so ECHO's loop
drafts nothing. Inside ``K_step`` the allocation is still Algorithm 1's (confident requests
first), so the uniform-depth estimate errs on the cautious side. Until ``warmup`` speculative steps have been seen, and on every
``explore_every``-th step after, the step gets the full ``K_max``, so ``a_d`` and ``t_draft``
keep being measured at the current load even while the model says not to speculate.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

import torch


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


class CostCurve:
    """A cost against a size, as measured: exponentially weighted means per half-octave of x,
    joined piecewise-linearly (and made non-decreasing), extended past the measured range with a
    :class:`LineFit`'s slope over all samples.

    A single line would miss Eq. 2's knee: on a CPU a verify of 1 or 8 tokens costs about the
    same, while the slope over 1..256 tokens charges every token alike."""

    def __init__(self, decay: float = 0.98) -> None:
        self.decay = decay
        self.line = LineFit(decay)
        self._buckets: dict[int, list[float]] = {}  # round(2 log2 x) -> [w, wx, wy]
        self._joined: Optional[tuple[list[float], list[float], float]] = None  # (xs, ys, slope) until add

    def add(self, x: float, y: float) -> None:
        self.line.add(x, y)
        b = self._buckets.setdefault(round(2 * math.log2(max(x, 1.0))), [0.0, 0.0, 0.0])
        for i, v in enumerate((1.0, x, y)):
            b[i] = self.decay * b[i] + v
        self._joined = None

    def _points(self) -> tuple[list[float], list[float], float]:
        """The joined curve, rebuilt only after an add (a step's cap queries it many times)."""
        if self._joined is None:
            pts = sorted((wx / w, wy / w) for w, wx, wy in self._buckets.values())
            ys = list(itertools.accumulate((p[1] for p in pts), max))
            self._joined = ([p[0] for p in pts], ys, self.line.slope())
        return self._joined

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


class CostModelBudget:
    """Chooses each decode step's verification cap (see the module docstring).

    The worker calls :meth:`cap` before drafting, :meth:`observe_step` with the step's timing,
    and :meth:`observe_accept` with the verify result; accept results are matched to the drafts
    they verified in order (overlap scheduling reports them one step late).
    """

    def __init__(self, k_max: int, max_depth: int, *, padded_width: Optional[int] = None,
                 warmup: int = 16, explore_every: int = 64, decay: float = 0.98, free_share: float = 0.02) -> None:
        if k_max < 1 or max_depth < 0 or warmup < 0 or explore_every < 2:
            raise ValueError(f"need k_max >= 1, max_depth >= 0, warmup >= 0, explore_every >= 2; got "
                             f"k_max={k_max} max_depth={max_depth} warmup={warmup} explore_every={explore_every}")
        self.k_max, self.max_depth = k_max, max_depth
        self.padded_width = padded_width  # None: ragged verify (the target computes sum K_i tokens)
        self.warmup, self.explore_every, self.decay = warmup, explore_every, decay
        self.free_share = free_share  # verify time a step may add for free tokens (see cap)
        self.verify = CostCurve(decay)  # seconds vs target tokens
        self.draft = CostCurve(decay)  # seconds per draft depth vs batch size
        self.rest = CostCurve(decay)  # rest of the step vs batch size
        self.reached = torch.zeros(max_depth)  # decayed count of trees that reached depth d = 1..
        self.accepted = torch.zeros(max_depth)  # ... whose first d drafts were all accepted
        self.spec_steps = 0  # steps that drafted at least one depth
        self.steps = 0
        self._pending: deque[torch.Tensor] = deque(maxlen=8)  # depths of steps awaiting their accept

    # -- the model -----------------------------------------------------------------------------
    def accept_rates(self) -> list[float]:
        """``a_d`` for d = 1..max_depth (0 where no tree reached d)."""
        return (self.accepted / (self.reached + 1.0)).tolist()

    def target_tokens(self, verified: int, batch_size: int) -> int:
        return verified if self.padded_width is None else batch_size * self.padded_width

    def expected_rate(self, batch_size: int, depth: int, rates: Optional[Sequence[float]] = None) -> float:
        """Expected tokens per second of a step whose B trees all reach ``depth`` (the objective)."""
        a = self.accept_rates() if rates is None else rates
        seconds = self.step_seconds(batch_size, depth)
        return batch_size * (1.0 + sum(a[:depth])) / seconds if seconds > 0 else 0.0

    def step_seconds(self, batch_size: int, depth: int) -> float:
        """Predicted seconds of a step whose B trees all reach ``depth``."""
        B = batch_size
        return (self.verify.predict(self.target_tokens(B * (1 + depth), B))
                + depth * self.draft.predict(B) + self.rest.predict(B))

    def best_depth(self, batch_size: int) -> int:
        """D*: the uniform tree depth with the highest expected tokens per second."""
        a = self.accept_rates()
        rates = [self.expected_rate(batch_size, d, a) for d in range(self.max_depth + 1)]
        return max(range(len(rates)), key=lambda d: (rates[d], -d))  # ties: the shallower

    # -- the worker's calls ----------------------------------------------------------------------
    def cap(self, batch_size: int) -> int:
        """This step's verification cap, roots included (``<= max(K_max, B)``)."""
        self.steps += 1
        if self.spec_steps < self.warmup or self.steps % self.explore_every == 0:
            return self.k_max
        B = batch_size
        depth = self.best_depth(B)
        k = min(self.k_max, B * (1 + depth))
        if depth == 0 or k >= self.k_max:
            return k
        # Below Eq. 2's knee verified tokens are (nearly) free: extend the cap while the verify
        # pass grows by at most `free_share` of the step, for Alg. 1 to spend (confident depth,
        # then width). Binary search: the verify curve is non-decreasing.
        limit = self.verify.predict(self.target_tokens(k, B)) + self.free_share * self.step_seconds(B, depth)
        lo, hi = k, self.k_max
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.verify.predict(self.target_tokens(mid, B)) <= limit:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def observe_step(self, *, batch_size: int, target_tokens: int, depths: torch.Tensor, draft_forwards: int,
                     draft_s: float, verify_s: float, step_s: float) -> None:
        """One decode step: its size, per-request tree depths, and wall seconds by phase
        (``draft_s``: drafting and control; ``step_s``: the whole step)."""
        if batch_size <= 0:
            return
        self.verify.add(target_tokens, verify_s)
        if draft_forwards > 0:
            self.spec_steps += 1
            self.draft.add(batch_size, draft_s / draft_forwards)
            self.rest.add(batch_size, max(step_s - verify_s - draft_s, 0.0))
        else:  # no draft depth: drafting was setup only, part of the step's fixed rest
            self.rest.add(batch_size, max(step_s - verify_s, 0.0))
        self._pending.append(depths.detach().to("cpu", torch.int64).reshape(-1))

    def observe_accept(self, accepted_drafts: Sequence[int]) -> None:
        """Accepted drafts per request of the oldest step not yet matched (bonus token excluded)."""
        if not self._pending:
            return
        depths = self._pending.popleft()
        if depths.numel() != len(accepted_drafts):
            return  # not the batch that step drafted for: nothing to learn from it
        d = torch.arange(1, self.max_depth + 1)[None, :]
        acc = torch.as_tensor(list(accepted_drafts), dtype=torch.int64)[:, None]
        self.reached = self.decay * self.reached + (depths[:, None] >= d).sum(0)
        self.accepted = self.decay * self.accepted + (acc.minimum(depths[:, None]) >= d).sum(0)
