"""AUC, thresholds and sweet spots against hand-computed cases."""

import numpy as np
import pytest

from sglang_echo.calibration.stats import (
    auc,
    auc_bootstrap_ci,
    expected_yield_threshold,
    summarise_depth,
    sweet_spots,
    youden_threshold,
)
from sglang_echo.core.calibration_file import DepthStats


def test_auc_hand_computed():
    # Pairs (acc, rej): (.9,.1) win, (.9,.5) win, (.4,.1) win, (.4,.5) loss -> 3/4.
    assert auc(np.array([0.9, 0.4]), np.array([0.1, 0.5])) == pytest.approx(0.75)
    # A tie counts one half: (.5,.5) -> .5, (.5,.2) -> 1 -> 0.75.
    assert auc(np.array([0.5]), np.array([0.5, 0.2])) == pytest.approx(0.75)
    assert auc(np.array([0.9, 0.8]), np.array([0.1])) == 1.0
    assert auc(np.array([]), np.array([0.1])) == 0.5


def test_bootstrap_interval_brackets_the_estimate():
    rng = np.random.default_rng(0)
    acc, rej = rng.normal(1, 1, 300), rng.normal(0, 1, 300)
    lo, hi = auc_bootstrap_ci(acc, rej, n_boot=300)
    assert lo < auc(acc, rej) < hi and hi - lo < 0.15


def test_youden_hand_computed():
    acc = np.array([0.9, 0.8, 0.6, 0.3])
    rej = np.array([0.7, 0.2, 0.1, 0.05])
    # cut .6: TPR 3/4, FPR 1/4 -> J .5; cut .8: TPR 2/4, FPR 0 -> .5; cut .3: TPR 1, FPR 1/4 -> .75.
    assert youden_threshold(acc, rej) == pytest.approx(0.3)


def test_expected_yield_prefers_lower_cuts_when_acceptance_is_common():
    acc = np.array([0.9, 0.8, 0.6, 0.3, 0.25, 0.25])
    rej = np.array([0.7, 0.26])
    # Net tokens TP - FP: cut .25 -> 6 - 2 = 4, cut .3 -> 4 - 1 = 3, cut .8 -> 2 - 0 = 2.
    # Youden J = TPR - FPR: cut .25 -> 0, cut .3 -> 4/6 - 1/2, cut .8 -> 2/6 - 0 (the best).
    assert expected_yield_threshold(acc, rej) == pytest.approx(0.25)
    assert youden_threshold(acc, rej) == pytest.approx(0.8)


def test_summary_and_sweet_spots():
    conf = np.array([0.9, 0.8, 0.2, 0.1])
    lab = np.array([True, True, False, False])
    row = summarise_depth(2, conf, lab)
    assert row.auc == 1.0 and row.accept_rate == 0.5 and row.threshold == pytest.approx(0.8)
    rows = [DepthStats(d, a, (a, a), 0.5, 40, 40, 0.3) for d, a in [(1, 0.6), (2, 0.9), (3, 0.65), (4, 0.72)]]
    assert sweet_spots(rows, target_depth=3, auc_min=0.7) == (1, 2, 3, 4)
    assert sweet_spots(rows, target_depth=3, auc_min=0.8) == (1, 2, 3)
    # A high AUC from 3 accepted samples is not a sweet spot.
    rare = rows + [DepthStats(5, 0.99, (0.9, 1.0), 0.01, 3, 300, 0.1)]
    assert sweet_spots(rare, target_depth=3, auc_min=0.7, min_class=10) == (1, 2, 3, 4)
    assert sweet_spots(rare, target_depth=3, auc_min=0.7, min_class=3) == (1, 2, 3, 4, 5)
    with pytest.raises(ValueError, match="criterion"):
        summarise_depth(1, conf, lab, criterion="magic")
