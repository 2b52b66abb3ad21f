"""The throughput model: replayed steps priced with cost curves measured on real hardware.

ECHO's speedup (Sec. 2, Eq. 1-2) is accepted tokens over step time. A replayed step ``s`` commits
``C_s`` tokens and verifies ``K_s`` (roots included), so for a batch of ``B`` requests::

    tokens/s  = sum_s C_s / sum_s (T_draft(s) + T_verify(B, K_s))
    AR tok/s  = B / T_verify(B, B)            (one token per request per target pass of B tokens)
    speedup   = tokens/s / AR tok/s

``T_verify(B, K)`` is read from a measured curve (``echo-replay measure-cost``: the target's
forward over ``K`` tokens for ``B`` requests, each with a realistic KV prefix), so the model has
whatever shape the hardware has: nearly flat then linear on a GPU (Eq. 2's
``T_AR (1 + gamma [K - K_max]^+)``), close to linear from the start on a CPU.
``T_draft(s)`` sums one drafter forward per drafted depth >= 1, priced by the rows it computes
(``B * F``, the padded frontier, as the EAGLE-3 drafter runs it; depth 1 reuses the catch-up's
logits), plus the catch-up of the committed tokens. Drafters without a measured draft curve
(e.g. the n-gram one, host-side lookups) are priced at zero and the output says so. The policy's
own control plane (gates, scheduling, packing) is a constant ``control_s`` per step that drafts,
0 unless given (``echo-replay run --control-ms``, from ``echo-bench scheduler`` or ``graphs``).

Curves are piecewise linear in ``x`` (tokens or rows) for every measured batch size, made
non-decreasing in ``x`` (a running maximum: a cheaper larger point is timing noise), extended
flat below the first point and along the last segment above the last one; between measured batch
sizes they are interpolated in ``log B``, outside them the nearest batch size's curve is used.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

SCHEMA = "sglang-echo/replay-cost"
VERSION = 1


@dataclass
class Curve:
    """Seconds as a function of (batch, x); ``points`` are ``(batch, x, seconds)``."""

    points: list[tuple[int, float, float]]

    def __post_init__(self) -> None:
        self._by_batch: dict[int, tuple[list[float], list[float]]] = {}
        for b in sorted({int(p[0]) for p in self.points}):
            pts = sorted((float(x), float(t)) for bb, x, t in self.points if int(bb) == b)
            # More tokens never cost less at a fixed batch size: a lower later point is timing
            # noise (shared machines), so the curve is the running maximum of the measurements.
            ys = list(itertools.accumulate((t for _, t in pts), max))
            self._by_batch[b] = ([x for x, _ in pts], ys)
        self._batches = sorted(self._by_batch)

    def _at(self, b: int, x: float) -> float:
        xs, ys = self._by_batch[b]
        if len(xs) == 1 or x <= xs[0]:
            return ys[0]
        i = min(bisect.bisect_left(xs, x), len(xs) - 1)  # segment (i-1, i); the last one beyond
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.0) if x1 != x0 else y1

    def __call__(self, batch: int, x: float) -> float:
        if not self._batches:
            raise ValueError("empty cost curve")
        bs = self._batches
        if batch <= bs[0]:
            return self._at(bs[0], x)
        if batch >= bs[-1]:
            return self._at(bs[-1], x)
        i = bisect.bisect_left(bs, batch)
        b0, b1 = bs[i - 1], bs[i]
        if b1 == batch:
            return self._at(b1, x)
        w = (math.log(batch) - math.log(b0)) / (math.log(b1) - math.log(b0))
        return (1 - w) * self._at(b0, x) + w * self._at(b1, x)


@dataclass
class CostModel:
    """A cost file: the verify curve and, optionally, the drafter's."""

    label: str
    verify: Curve
    draft_kind: Optional[str] = None
    draft_forward: Optional[Curve] = None  # x = rows (B * F)
    draft_catch_up: Optional[Curve] = None  # x = rows (B * tokens per request)
    meta: dict[str, Any] = field(default_factory=dict)
    control_s: float = 0.0  # the control plane per step that drafts (not in the cost file: it depends on the code)

    @classmethod
    def load(cls, path: str | Path) -> "CostModel":
        raw = json.loads(Path(path).read_text())
        if raw.get("schema") != SCHEMA:
            raise ValueError(f"{path}: not a {SCHEMA} file")
        pts = lambda rows, key: [(r["batch"], r[key], r["seconds"]) for r in rows]
        draft = raw.get("draft") or {}
        return cls(
            label=raw.get("label") or Path(path).stem,
            verify=Curve(pts(raw["verify"], "tokens")),
            draft_kind=draft.get("kind"),
            draft_forward=Curve(pts(draft["forward"], "rows")) if draft.get("forward") else None,
            draft_catch_up=Curve(pts(draft["catch_up"], "rows")) if draft.get("catch_up") else None,
            meta={k: raw.get(k) for k in ("machine", "target", "time", "command")},
        )

    def draft_priced(self, drafter: str) -> bool:
        return self.draft_kind == drafter and self.draft_forward is not None

    def step_draft_s(self, drafter: str, calls, catch_up: tuple[int, int]) -> float:
        if not self.draft_priced(drafter):
            return 0.0
        t = sum(self.draft_forward(B, B * F) for depth, B, F, _ in calls if depth >= 1)
        rows, per = catch_up
        if self.draft_catch_up is not None and per > 0:
            t += self.draft_catch_up(rows, rows * per)
        return t

    def throughput(self, res, drafter: str) -> dict:
        """Modelled figures for one :class:`~sglang_echo.replay.simulate.ReplayResult`."""
        B = res.batch_size
        draft = sum(self.step_draft_s(drafter, c, cu) for c, cu in zip(res.draft_calls, res.catch_up))
        verify = sum(self.verify(B, k) for k in res.verified_total)
        control = self.control_s * sum(1 for calls in res.draft_calls if calls)  # steps that drafted at all
        total = draft + verify + control
        tps = sum(res.committed) / total if total > 0 else 0.0
        ar = B / self.verify(B, B)
        steps = max(res.steps, 1)
        return {
            "cost": self.label,
            "draft_ms_per_step": 1e3 * draft / steps,
            "verify_ms_per_step": 1e3 * verify / steps,
            "control_ms_per_step": 1e3 * control / steps,
            "tokens_per_s": tps,
            "ar_tokens_per_s": ar,
            "speedup": tps / ar if ar > 0 else 0.0,
            "draft_priced": self.draft_priced(drafter),
        }
