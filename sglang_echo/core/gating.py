"""Sparse confidence gating (ECHO Sec. 3.2, Eq. 6-7).

The layer confidence of request i at draft depth d is the probability of its best path so far,
``c_{i,d} = exp(max_j S_{i,d,j})`` (Eq. 6); the gate ``g_{i,d} = 1[c_{i,d} >= tau_d]`` (Eq. 7)
is evaluated only at the calibrated sweet-spot depths ``D_sig``. Everywhere else requests pass.

Dense gating and the fixed-threshold ablation (Sec. 5.3) are the same mechanism with other
depths or thresholds, so they are built here too rather than as separate code paths.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

from .calibration_file import Calibration, load_calibration

log = logging.getLogger(__name__)

# Used when no calibration file is given: the paper's LLaMA-3.1-8B calibration (App. C.4),
# read as depths {1, 3, 5}. A real deployment should calibrate (echo-calibrate); the plugin
# logs loudly when it falls back to these.
DEFAULT_SWEET_SPOTS = (1, 3, 5)
DEFAULT_THRESHOLDS = (0.2, 0.35, 0.5)


@dataclass(frozen=True)
class GatingConfig:
    """Which draft depths carry a gate, and each gate's threshold tau_d."""

    depths: tuple[int, ...]
    thresholds: tuple[float, ...]
    source: str = "defaults"

    def __post_init__(self) -> None:
        if len(self.depths) != len(self.thresholds):
            raise ValueError(f"{len(self.depths)} gate depths but {len(self.thresholds)} thresholds")
        if any(d < 1 for d in self.depths):
            raise ValueError(f"gate depths start at 1 (the root's children), got {self.depths}")
        if any(not 0.0 <= t <= 1.0 for t in self.thresholds):
            raise ValueError(f"thresholds are probabilities in [0, 1], got {self.thresholds}")

    @classmethod
    def default(cls) -> "GatingConfig":
        return cls(DEFAULT_SWEET_SPOTS, DEFAULT_THRESHOLDS, "defaults (paper App. C.4, uncalibrated)")

    @classmethod
    def from_calibration(cls, calib: Calibration, source: str = "calibration") -> "GatingConfig":
        """ECHO's sparse gates: only the sweet spots D_sig, each with its own tau_d."""
        return cls(calib.sweet_spots, tuple(calib.threshold(d) for d in calib.sweet_spots), source)

    @classmethod
    def dense(cls, calib: Optional[Calibration], max_depth: int) -> "GatingConfig":
        """Ablation: a gate at every depth, each with its own calibrated tau_d."""
        if calib is None:
            base = cls.default()
            taus = [base.thresholds[-1] if d > base.depths[-1] else _interp(base, d) for d in range(1, max_depth + 1)]
            return cls(tuple(range(1, max_depth + 1)), tuple(taus), "dense (uncalibrated)")
        rows = {r.depth: r.threshold for r in calib.depths}
        depths = tuple(d for d in range(1, max_depth + 1) if d in rows)
        return cls(depths, tuple(rows[d] for d in depths), "dense (calibration)")

    @classmethod
    def fixed(cls, tau: float, depths: tuple[int, ...]) -> "GatingConfig":
        """Ablation: the same sparse gate depths, one threshold for all of them."""
        return cls(tuple(depths), (float(tau),) * len(depths), f"fixed tau={tau}")

    @classmethod
    def load(
        cls,
        path: Optional[str | Path],
        *,
        model_fingerprint: Optional[str] = None,
        drafter_fingerprint: Optional[str] = None,
    ) -> "GatingConfig":
        """From a calibration file, or the documented defaults (logged) when ``path`` is None."""
        if path is None:
            cfg = cls.default()
            log.warning("ECHO: no calibration file given, gating with %s: %s", cfg.source, cfg.describe())
            return cfg
        calib = load_calibration(path, model_fingerprint=model_fingerprint, drafter_fingerprint=drafter_fingerprint)
        return cls.from_calibration(calib, source=str(path))

    def describe(self) -> str:
        return ", ".join(f"d{d}:{t:.3g}" for d, t in zip(self.depths, self.thresholds))

    def threshold_table(self, max_depth: int, device: torch.device | str = "cpu") -> Tensor:
        """``tau[d]`` for d = 0..max_depth; 0 where there is no gate (c >= 0 always passes)."""
        table = torch.zeros(max_depth + 1, device=device)
        for d, t in zip(self.depths, self.thresholds):
            if d <= max_depth:
                table[d] = t
        return table


def _interp(cfg: GatingConfig, d: int) -> float:
    """Threshold for an uncalibrated depth: the next gate's threshold (the stricter neighbour)."""
    for gd, t in zip(cfg.depths, cfg.thresholds):
        if d <= gd:
            return t
    return cfg.thresholds[-1]


def layer_confidence(path_score: Tensor, valid: Tensor) -> Tensor:
    """Eq. 6 over one depth of candidates ``[B, C]``: exp of the best valid path score, ``[B]``.

    A request with no valid candidate has confidence 0 and therefore never passes a gate.
    """
    best = torch.where(valid, path_score, float("-inf")).amax(dim=1)
    return best.exp()
