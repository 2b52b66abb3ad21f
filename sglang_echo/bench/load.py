"""How one benchmark level loads a server: a closed loop of ``concurrency`` clients (each sends its
next request when the last one finished: ``--concurrency``), or an open loop of Poisson arrivals at
a request rate (``--request-rate``), at most ``concurrency`` requests in flight (``--max-concurrency``;
a request that arrives while the cap is reached waits for a free slot, and its latency counts from
when it is sent)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Level:
    """One level: ``concurrency`` clients (closed loop), or Poisson arrivals at ``rate`` requests/s
    with at most ``concurrency`` in flight (``rate`` set)."""

    concurrency: int
    rate: float | None = None

    @property
    def key(self) -> float:
        """What a level is known by in the report: its rate, or its concurrency."""
        return self.concurrency if self.rate is None else self.rate

    @property
    def label(self) -> str:
        if self.rate is None:
            return f"c={self.concurrency}"
        return ("inf" if math.isinf(self.rate) else f"{self.rate:g}") + " req/s"


def run_level(
    send: Callable[[int], T], n: int, concurrency: int, arrivals: Sequence[float] | None = None
) -> tuple[float, list[T]]:
    """Call ``send(i)`` for ``i < n`` with at most ``concurrency`` calls at once: as soon as a slot
    frees (``arrivals`` None), or not before ``arrivals[i]`` seconds after the start. Returns the
    wall seconds from the start until the last call returned, and each call's result in order (the
    first exception raised by a call is raised here, once every call has ended)."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, n))) as pool:
        if arrivals is None:
            futures = [pool.submit(send, i) for i in range(n)]
        else:
            futures = _submit_on_schedule(pool, send, arrivals, t0)
        results = [f.result() for f in futures]
    return time.perf_counter() - t0, results


def _submit_on_schedule(
    pool: ThreadPoolExecutor, send: Callable[[int], T], arrivals: Sequence[float], t0: float
) -> list[Future]:
    """Submit call ``i`` at ``t0 + arrivals[i]`` (the pool queues it while every worker is busy)."""
    futures: list[Future] = []
    for i, at in enumerate(arrivals):
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        futures.append(pool.submit(send, i))
    return futures
