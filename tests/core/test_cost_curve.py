"""The cost budget's measured curves: a weighted line, the half-octave curve with Eq. 2's knee,
and isotonic pooling (sglang_echo.core.cost_curve)."""

import pytest

from sglang_echo.core.cost_curve import CostCurve, LineFit, isotonic


def test_line_fit_recovers_a_line_and_stays_flat_without_spread():
    fit = LineFit(decay=0.99)
    for x in range(1, 65):
        fit.add(x, 0.05 + 0.002 * x)
    assert fit.predict(32) == pytest.approx(0.114, rel=1e-6)
    assert fit.predict(128) == pytest.approx(0.306, rel=1e-6)
    flat = LineFit()
    for _ in range(5):
        flat.add(8, 0.1)
    assert flat.predict(64) == pytest.approx(0.1)  # one x seen: no slope to extrapolate
    down = LineFit()  # a (noisy) falling cost is never extrapolated below zero
    for x, y in ((1, 1.0), (2, 0.5), (3, 0.0)):
        down.add(x, y)
    assert down.predict(100) >= 0.0
    assert LineFit().predict(3) == 0.0


def test_cost_curve_keeps_the_knee_a_line_would_miss():
    """Eq. 2's shape: flat up to 8 tokens, then 2 ms per token."""
    cost = lambda n: 0.06 + 0.002 * max(n - 8, 0)  # noqa: E731
    curve, line = CostCurve(), LineFit()
    for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64) * 3:
        curve.add(n, cost(n))
        line.add(n, cost(n))
    assert curve.predict(1) == pytest.approx(0.06) and curve.predict(5) == pytest.approx(0.06)
    assert curve.predict(40) == pytest.approx(cost(40), rel=0.02)
    # a line charges the flat part's drafts their slope: 4 more tokens at batch 1 look 10% dearer
    assert line.predict(5) - line.predict(1) > 0.005 > abs(curve.predict(5) - curve.predict(1))
    assert curve.predict(128) == pytest.approx(curve.predict(64) + 64 * line.slope())  # past the data: the slope
    noisy = CostCurve()  # a cheaper large batch (noise) never makes the curve fall
    for n, y in ((4, 0.10), (16, 0.08), (64, 0.2)):
        noisy.add(n, y)
    assert noisy.predict(16) >= noisy.predict(4)
    assert CostCurve().predict(7) == 0.0


def test_one_slow_step_does_not_raise_every_larger_size():
    """Isotonic pooling, not a running maximum: a single 46 ms outlier at batch 2 is outweighed by
    thirty 12 ms steps at batch 8 instead of pricing batch 8 at 46 ms."""
    rest = CostCurve(decay=1.0)
    rest.add(1, 0.007)
    rest.add(2, 0.046)
    for _ in range(30):
        rest.add(8, 0.012)
    assert rest.predict(8) == pytest.approx((0.046 + 30 * 0.012) / 31)
    assert rest.predict(1) == pytest.approx(0.007) and rest.predict(2) == rest.predict(8)
    assert isotonic([1.0, 3.0, 2.0, 4.0], [1.0, 1.0, 1.0, 1.0]) == [1.0, 2.5, 2.5, 4.0]
    assert isotonic([5.0, 1.0], [1.0, 3.0]) == [2.0, 2.0]


def test_timings_bound_outliers_and_restart_a_cold_bucket():
    """A process's first steps run cold (3-4 s against 40 ms): a bucket seeded by one restarts at
    the first sample four times below its mean, and a later spike counts as four times the mean."""
    curve = CostCurve(outlier=4.0)
    curve.add(8, 3.5)  # cold
    curve.add(8, 0.040)
    assert curve.predict(8) == pytest.approx(0.040)
    curve.add(8, 0.400)  # a spike: counted as 0.16
    assert curve.predict(8) == pytest.approx((0.98 * 0.040 + 0.160) / 1.98)
    plain = CostCurve()  # gains and counts: no bound
    plain.add(8, 3.5)
    plain.add(8, 0.040)
    assert plain.predict(8) > 1.0


def test_slack_keeps_near_zero_costs_and_still_bounds_spikes():
    """Costs near 0 (a step's rest, about 1 ms): ratios within ``slack`` of the mean are noise,
    not outliers, while a one-off 58 ms step (a buffer's first allocation) is still bounded, and
    a bucket it seeded restarts."""
    curve = CostCurve(outlier=4.0, slack=0.005)
    for y in (0.001, 0.0001, 0.001):  # 10x below the mean, but within the slack: kept
        curve.add(8, y)
    mean = (0.98**2 * 0.001 + 0.98 * 0.0001 + 0.001) / (0.98**2 + 0.98 + 1)
    assert curve.predict(8) == pytest.approx(mean)
    curve.add(8, 0.058)  # a spike: counted as the mean plus the slack
    w = 0.98**2 + 0.98 + 1  # the three samples' weight
    assert curve.predict(8) == pytest.approx((0.98 * w * mean + mean + 0.005) / (0.98 * w + 1))
    seeded = CostCurve(outlier=4.0, slack=0.005)
    seeded.add(8, 0.058)  # the first step
    seeded.add(8, 0.001)
    assert seeded.predict(8) == pytest.approx(0.001)
