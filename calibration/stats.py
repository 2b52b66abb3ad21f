"""Separability statistics behind the calibration: AUC per depth, sweet spots, thresholds.

For every probed step and draft depth d the calibrator records the layer confidence c_{i,d}
(Eq. 6) and whether the target accepted a node at depth d. A depth is a *sweet spot* when that
confidence separates accepted from rejected well, i.e. its AUC exceeds xi; its threshold tau_d is
the confidence cut that separates them best (Youden's J by default).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from scipy.stats import rankdata

from sglang_echo.core.calibration_file import DepthStats

# xi: AUC 0.7 is the conventional floor of "acceptable" discrimination (Hosmer & Lemeshow,
# Applied Logistic Regression, ch. 5); below it a gate misjudges too often to be worth placing.
DEFAULT_AUC_MIN = 0.7


def auc(accepted: np.ndarray, rejected: np.ndarray) -> float:
    """Mann-Whitney AUC: P(c_acc > c_rej) + P(c_acc == c_rej) / 2 (0.5 when a class is empty)."""
    n_a, n_r = len(accepted), len(rejected)
    if n_a == 0 or n_r == 0:
        return 0.5
    ranks = rankdata(np.concatenate([accepted, rejected]))  # average ranks handle ties
    return float((ranks[:n_a].sum() - n_a * (n_a + 1) / 2) / (n_a * n_r))


def auc_bootstrap_ci(
    accepted: np.ndarray, rejected: np.ndarray, n_boot: int = 500, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the AUC, resampling each class separately."""
    if len(accepted) == 0 or len(rejected) == 0:
        return (0.5, 0.5)
    rng = np.random.default_rng(seed)
    stats = [auc(rng.choice(accepted, len(accepted)), rng.choice(rejected, len(rejected))) for _ in range(n_boot)]
    lo, hi = np.quantile(stats, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def _cuts(accepted: np.ndarray, rejected: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every distinct cut t (gate passes when c >= t) with the accepted/rejected counts passing."""
    cuts = np.unique(np.concatenate([accepted, rejected]))
    tp = len(accepted) - np.searchsorted(np.sort(accepted), cuts, side="left")
    fp = len(rejected) - np.searchsorted(np.sort(rejected), cuts, side="left")
    return cuts, tp, fp


def youden_threshold(accepted: np.ndarray, rejected: np.ndarray) -> float:
    """The cut maximising TPR - FPR (Youden's J); the lowest such cut on ties."""
    if len(accepted) == 0 or len(rejected) == 0:
        return 0.0 if len(rejected) == 0 else 1.0
    cuts, tp, fp = _cuts(accepted, rejected)
    j = tp / len(accepted) - fp / len(rejected)
    return float(cuts[int(np.argmax(j))])


def expected_yield_threshold(accepted: np.ndarray, rejected: np.ndarray) -> float:
    """The cut maximising accepted-minus-rejected tokens among those passing.

    A passing accepted node adds a committed token; a passing rejected one wastes a verify slot
    another request could have used (Theorem 2's exchange argument at unit cost). Unlike Youden's
    J this weighs classes by their counts, so frequent acceptance lowers the threshold.
    """
    if len(accepted) == 0:
        return 1.0
    if len(rejected) == 0:
        return 0.0
    cuts, tp, fp = _cuts(accepted, rejected)
    return float(cuts[int(np.argmax(tp - fp))])


CRITERIA = {"youden": youden_threshold, "expected-yield": expected_yield_threshold}


def summarise_depth(
    depth: int, confidence: np.ndarray, accepted: np.ndarray, criterion: str = "youden", seed: int = 0
) -> DepthStats:
    """All per-depth statistics from samples (confidence c_{i,d}, accepted label)."""
    if criterion not in CRITERIA:
        raise ValueError(f"unknown threshold criterion {criterion!r}; choose one of {', '.join(CRITERIA)}")
    acc, rej = confidence[accepted], confidence[~accepted]
    n = len(confidence)
    return DepthStats(
        depth=depth,
        auc=auc(acc, rej),
        auc_ci=auc_bootstrap_ci(acc, rej, seed=seed),
        accept_rate=float(len(acc) / n) if n else 0.0,
        num_accepted=len(acc),
        num_rejected=len(rej),
        threshold=CRITERIA[criterion](acc, rej),
    )


# An AUC from a handful of accepted (or rejected) samples is noise: deep depths that a weak drafter
# almost never gets accepted at show AUCs near 1 from a few lucky samples. Thirty per class is the
# usual floor for a normal-approximation interval (the bootstrap CI in the report shows the rest).
MIN_CLASS_SAMPLES = 30


def sweet_spots(
    rows: list[DepthStats], target_depth: int, auc_min: float = DEFAULT_AUC_MIN, min_class: int = MIN_CLASS_SAMPLES
) -> tuple[int, ...]:
    """D_sig: the root gate (d = 1), the target depth, and every depth whose AUC exceeds xi on at
    least ``min_class`` accepted and ``min_class`` rejected samples."""
    probed = {r.depth for r in rows}
    chosen = {d for d in (1, target_depth) if d in probed}
    chosen |= {r.depth for r in rows if r.auc > auc_min and min(r.num_accepted, r.num_rejected) >= min_class}
    return tuple(sorted(chosen))


# A verify pass "costs about the same" as the cheapest one while within this slack: ECHO's K_max
# is the budget where the verify-cost curve leaves its flat (memory-bound) part (Sec. 3.1).
KNEE_SLACK = 0.25


def verify_cost_knee(
    tokens: np.ndarray, seconds: np.ndarray, slack: float = KNEE_SLACK, warmup: int = 8, min_steps: int = 3
) -> tuple[Optional[int], list[tuple[int, float, int]]]:
    """Suggested K_max from measured verify passes (in time order), and the curve it read.

    The first ``warmup`` passes are dropped (first calls allocate and pick kernels; they are also
    the small batches of the ramp-up, which would otherwise look slow), and counts seen fewer than
    ``min_steps`` times are left out. The curve is the median time per verified-token count,
    ``[(tokens, median_s, n)]``; the knee is the largest count whose median stays within
    ``(1 + slack)`` of the smallest count's, scanning upwards. None with fewer than two counts.
    """
    tokens, seconds = tokens[warmup:], seconds[warmup:]
    curve = []
    for n in np.unique(tokens):
        t = seconds[tokens == n]
        if len(t) >= min_steps:
            curve.append((int(n), float(np.median(t)), int(len(t))))
    if len(curve) < 2:
        return None, curve
    base, knee = curve[0][1], curve[0][0]
    for n, t, _ in curve[1:]:
        if t > (1 + slack) * base:
            break
        knee = n
    return knee, curve
