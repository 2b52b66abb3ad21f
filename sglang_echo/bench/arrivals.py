"""When each request of an open-loop level is sent: Poisson arrivals at a fixed rate, seeded.

A Poisson process of rate R has independent exponential gaps of mean 1/R, so a level of n
requests sends request 0 at once and request i after the sum of i gaps, as ``sglang``'s serving
benchmark does. ``inf`` sends every request at once. The same seed gives the same
schedule to every config and pass: the configs of one level meet the same load.
"""

from __future__ import annotations

import math

import numpy as np


def parse_rates(text: str) -> list[float]:
    """``--request-rate``: a comma list of requests per second, each > 0, or ``inf`` (ValueError
    with the offending entry)."""
    rates = []
    for part in text.split(","):
        try:
            rate = float(part)
        except ValueError:
            raise ValueError(f"--request-rate {part!r}: expected requests per second (a number > 0) or inf") from None
        if math.isnan(rate) or rate <= 0:
            raise ValueError(f"--request-rate {part!r}: must be > 0 (inf: every request at once)")
        rates.append(rate)
    return rates


def poisson_arrivals(n: int, rate: float, seed: int = 0) -> np.ndarray:
    """Send times (seconds from the level's start) of ``n`` requests arriving as a Poisson process
    of ``rate`` requests/s: 0, then the cumulative sums of ``n - 1`` exponential gaps of mean
    ``1 / rate`` drawn from ``numpy.random.default_rng(seed)``; all zeros for ``rate = inf``."""
    if rate <= 0 or math.isnan(rate):
        raise ValueError(f"request rate must be > 0, got {rate}")
    if math.isinf(rate):
        return np.zeros(n)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=max(n - 1, 0))
    return np.concatenate([np.zeros(min(n, 1)), np.cumsum(gaps)])
