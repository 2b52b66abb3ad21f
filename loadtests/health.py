"""A server's health over a run: a thread that polls ``GET /health`` on a fixed schedule.

sglang's ``/health`` answers 200 once the scheduler has produced anything since the poll began
(it queues a one-token generation and waits for any output, up to its own 20 s), so a server
whose scheduler died or hangs fails the poll even while its HTTP front end still answers.
The poller runs in a thread of its own, not among the load's users, so a client saturated by its
own users cannot make it skip polls unnoticed: each poll records when it was sent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import requests

Get = Callable[..., Any]  # requests.get's signature: (url, timeout=...) -> a response with .status_code


@dataclass(frozen=True)
class Poll:
    start: float  # wall clock (epoch seconds)
    latency_s: float
    status: int  # HTTP status; 0 where none came (refused, reset, timed out)

    @property
    def ok(self) -> bool:
        return self.status == 200


@dataclass(frozen=True)
class HealthReport:
    """``longest_unhealthy_s``: the longest time from a failed poll to the next poll that
    succeeded (to the end of polling where none did); 0 when no poll failed."""

    polls: int
    failed: int
    longest_unhealthy_s: float
    first_failure: float | None  # wall clock of the first failed poll
    interval_s: float
    failed_at: list[float] = field(default_factory=list)  # wall clock of every failed poll
    # HTTP status of every failed poll: 503 is sglang's own verdict (no scheduler output for its
    # SGLANG_HEALTH_CHECK_TIMEOUT, 20 s), 0 no answer at all (refused, reset, timed out).
    failed_status: list[int] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return self.polls > 0 and self.failed == 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def health_report(polls: Sequence[Poll], end: float, interval_s: float) -> HealthReport:
    """What ``polls`` (in time order) say about the stretch of time up to ``end``."""
    longest, since = 0.0, None
    for p in polls:
        if not p.ok and since is None:
            since = p.start
        elif p.ok and since is not None:
            longest, since = max(longest, p.start - since), None
    if since is not None:
        longest = max(longest, end - since)
    failed = [p for p in polls if not p.ok]
    return HealthReport(
        polls=len(polls),
        failed=len(failed),
        longest_unhealthy_s=longest,
        first_failure=failed[0].start if failed else None,
        interval_s=interval_s,
        failed_at=[p.start for p in failed],
        failed_status=[p.status for p in failed],
    )


class HealthPoller:
    """Polls ``{host}/health`` every ``interval_s`` (from one poll's start to the next; a poll
    slower than that is followed by the next at once) until :meth:`stop`; the first poll is sent
    at :meth:`start`."""

    def __init__(self, host: str, interval_s: float = 5.0, timeout_s: float = 30.0, get: Get = requests.get) -> None:
        self.url = f"{host}/health"
        self.interval_s, self.timeout_s, self._get = interval_s, timeout_s, get
        self.polls: list[Poll] = []
        self.on_change: Callable[[Poll], None] | None = None  # called when a poll's health differs from the last
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-poller", daemon=True)

    def _poll(self) -> Poll:
        start, t0 = time.time(), time.perf_counter()
        try:
            status = int(self._get(self.url, timeout=self.timeout_s).status_code)
        except requests.RequestException:
            status = 0
        return Poll(start, time.perf_counter() - t0, status)

    def _run(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            poll = self._poll()
            if self.on_change is not None and (not self.polls or self.polls[-1].ok != poll.ok):
                self.on_change(poll)
            self.polls.append(poll)
            due = max(due + self.interval_s, time.monotonic())
            self._stop.wait(max(0.0, due - time.monotonic()))

    def start(self) -> HealthPoller:
        self._thread.start()
        return self

    def stop(self) -> HealthReport:
        """Stop polling (a poll in flight is waited for) and report."""
        self._stop.set()
        self._thread.join()
        return health_report(self.polls, time.time(), self.interval_s)
