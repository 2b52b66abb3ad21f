"""A soak's report: what its normal and hostile requests, its health polls and its greedy check
found, the verdict, and the two files it is written to (``summary.json``, ``soak.md``).

The verdict fails a soak for what says the server broke: a normal request that failed, a
hostile request answered with a 5xx or not at all (reset, closed, timed out), a failed health
poll, or no answer to the greedy request after the run. Warnings report what is worth a look but
proves nothing broke: a greedy answer that differs from before the run (greedy decoding is
reproducible only where the server's numerics are: a speculative server's bf16 verify pass varies
with the tree shapes its budget picks, so two identical requests may differ at a near-tie; the
check says whether the server already did so before the run, and where the answers part), a
hostile request the server ran (2xx) where a 4xx was expected (it survived it), no hostile
request sent at all, a client short of CPU.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .health import HealthReport
from .hostile import HostileCase, HostileSample, Outcome, ServedModel
from .measure import Sample
from .summary import LevelResult

SUMMARY_JSON = "summary.json"
SOAK_MD = "soak.md"
LISTED_FAILURES = 50  # soak.md lists this many hostile failures; summary.json all of them
OUTCOME_HEADERS = {
    Outcome.REJECTED: "4xx",
    Outcome.ACCEPTED: "2xx",
    Outcome.SERVER_ERROR: "5xx",
    Outcome.CONNECTION: "connection",
    Outcome.TIMEOUT: "timeout",
}


@dataclass(frozen=True)
class Percentiles:
    """p50 / p90 / p99 in milliseconds; None where there was nothing to measure."""

    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None

    @classmethod
    def of(cls, seconds: Sequence[float | None]) -> Percentiles:
        present = [s for s in seconds if s is not None]
        if not present:
            return cls()
        p50, p90, p99 = np.percentile(np.asarray(present) * 1e3, [50, 90, 99])
        return cls(float(p50), float(p90), float(p99))

    def cell(self) -> str:
        return " / ".join("-" if v is None else f"{v:,.0f}" for v in (self.p50_ms, self.p90_ms, self.p99_ms))


@dataclass(frozen=True)
class NormalTraffic:
    """The load's own requests; latencies over the successful ones, TTFT over streaming ones."""

    requests: int
    failures: int
    errors: dict[str, int]
    output_tokens: int
    tokens_per_s: float
    req_per_s: float
    latency: Percentiles
    ttft: Percentiles
    client_cpu_warning: bool  # locust ran out of CPU: the client, not the server, may have limited

    @classmethod
    def of(cls, level: LevelResult, samples: Sequence[Sample]) -> NormalTraffic:
        ok = [s for s in samples if s.ok]
        return cls(
            requests=level.requests,
            failures=level.failures,
            errors=dict(level.errors),
            output_tokens=level.output_tokens,
            tokens_per_s=level.tokens_per_s,
            req_per_s=level.req_per_s,
            latency=Percentiles.of([s.latency_s for s in ok]),
            ttft=Percentiles.of([s.ttft_s for s in ok]),
            client_cpu_warning=level.client_cpu_warning,
        )


@dataclass(frozen=True)
class CaseTally:
    name: str
    expected: str
    outcomes: dict[str, int]  # Outcome value -> requests

    @property
    def sent(self) -> int:
        return sum(self.outcomes.values())


@dataclass(frozen=True)
class HostileTraffic:
    """Every hostile request's answer, by case; ``failed`` lists each one the server broke on."""

    every: int  # one hostile request before every ``every``-th normal one (0: none)
    outcomes: dict[str, int]
    cases: list[CaseTally]
    failed: list[HostileSample]
    latency: Percentiles

    @classmethod
    def of(cls, every: int, cases: Sequence[HostileCase], samples: Sequence[HostileSample]) -> HostileTraffic:
        by_case: dict[str, Counter] = {c.name: Counter() for c in cases}
        for s in samples:
            by_case.setdefault(s.name, Counter())[s.outcome] += 1
        expected = {c.name: c.expected.value for c in cases}
        return cls(
            every=every,
            outcomes=dict(Counter(s.outcome for s in samples)),
            cases=[CaseTally(name, expected.get(name, ""), dict(n)) for name, n in by_case.items()],
            failed=sorted((s for s in samples if s.failed), key=lambda s: s.start),
            latency=Percentiles.of([s.latency_s for s in samples]),
        )

    @property
    def sent(self) -> int:
        return sum(self.outcomes.values())

    @property
    def unexpected(self) -> list[str]:
        """Cases some request of which was answered neither as expected nor with a failure (a 2xx
        where a 4xx was expected, or the reverse)."""
        return [c.name for c in self.cases if any(o != c.expected and not Outcome(o).failed for o in c.outcomes)]


@dataclass(frozen=True)
class GreedyCheck:
    """The same greedy request twice before the run (``before``, ``repeat``) and once after it
    (``after``); None: no answer."""

    prompt: str
    max_tokens: int
    before: str | None
    repeat: str | None
    after: str | None

    @property
    def identical(self) -> bool:
        return self.before is not None and self.before == self.after

    @property
    def reproducible_before(self) -> bool:
        """The two answers before the run agreed: the server's greedy answer was reproducible."""
        return self.before is not None and self.before == self.repeat

    @property
    def common_prefix(self) -> int:
        """Characters ``after`` shares with ``before`` from the start."""
        a, b = self.before or "", self.after or ""
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    def describe(self) -> str:
        if self.after is None:
            return "no answer after the run"
        if self.identical:
            return "identical" + (
                "" if self.reproducible_before else " (though the two answers before the run differed)"
            )
        why = (
            "the server already answered it differently twice in a row before the run"
            if not self.reproducible_before
            else "the two answers before the run were identical"
        )
        return (
            f"DIFFERENT after {self.common_prefix} of {len(self.before or '')} characters "
            f"({why}): {self.before!r} / {self.repeat!r} before, {self.after!r} after"
        )


@dataclass(frozen=True)
class SoakReport:
    command: str
    machine: dict[str, Any]
    host: str
    model: ServedModel
    users: int
    seconds: int
    settings: dict[str, Any]  # the rest of the load's settings (max_tokens, timeouts, ...)
    started: float  # wall clock
    duration_s: float  # until the last request ended and the health poller stopped
    normal: NormalTraffic
    hostile: HostileTraffic
    health: HealthReport
    greedy: GreedyCheck
    notes: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        """Why the soak failed, one line per reason; empty if it passed."""
        out = []
        if self.normal.requests == 0:
            out.append("no normal request finished")
        if self.normal.failures:
            errors = " ".join(f"{k}={v}" for k, v in self.normal.errors.items())
            out.append(f"{_n(self.normal.failures, 'normal request')} failed ({errors})")
        if self.hostile.failed:
            names = sorted({s.name for s in self.hostile.failed})
            out.append(f"{_n(len(self.hostile.failed), 'hostile request')} got a 5xx or no answer: {', '.join(names)}")
        if not self.health.healthy:
            out.append(
                f"{self.health.failed} of {_n(self.health.polls, 'health poll')} failed "
                f"(longest unhealthy stretch {self.health.longest_unhealthy_s:.0f} s)"
            )
        if self.greedy.after is None:
            out.append("the server did not answer the greedy reference request after the run")
        return out

    def warnings(self) -> list[str]:
        """What is worth a look but does not fail the soak, one line each."""
        out = []
        if self.greedy.after is not None and not self.greedy.identical:
            out.append(f"the greedy reference answer differs from before the run: {self.greedy.describe()}")
        if self.hostile.unexpected:
            out.append(
                f"hostile cases answered otherwise than expected (not a 5xx): {', '.join(self.hostile.unexpected)}"
            )
        if self.hostile.every and not self.hostile.sent:
            out.append("no hostile request was sent (too few normal requests for --hostile-every)")
        if self.normal.client_cpu_warning:
            out.append("locust warned that it ran out of CPU: the client may have limited the load")
        return out

    @property
    def passed(self) -> bool:
        return not self.problems()

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["hostile"] |= {"sent": self.hostile.sent, "unexpected": self.hostile.unexpected}
        data["greedy"] |= {"identical": self.greedy.identical, "reproducible_before": self.greedy.reproducible_before}
        data["health"]["healthy"] = self.health.healthy
        return {**data, "passed": self.passed, "problems": self.problems(), "warnings": self.warnings()}


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _at(times: Sequence[float], start: float, statuses: Sequence[int] = ()) -> str:
    """`` (at 53, 653 s)``: when, in seconds from ``start``, each with its HTTP status where given
    (`` (503 at 53 s, no answer at 653 s)``); empty for no times."""
    if not times:
        return ""
    if not statuses:
        return f" (at {', '.join(f'{t - start:.0f}' for t in times)} s)"
    return " (" + ", ".join(f"{s or 'no answer'} at {t - start:.0f} s" for t, s in zip(times, statuses)) + ")"


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(epoch))


def markdown(r: SoakReport) -> str:
    """``soak.md``: the command, the machine, and the tables."""
    n, h, hl = r.normal, r.hostile, r.health
    m = r.machine
    load = " ".join(f"{x:.2f}" for x in m.get("load_average") or ())
    machine = ", ".join(
        str(x)
        for x in (
            m.get("cpu"),
            f"{m.get('cores')} cores",
            m.get("platform"),
            f"Python {m.get('python')}",
            f"torch {m.get('torch')}",
        )
        if x
    )
    every = f"1 hostile request per {h.every} normal ones" if h.every else "no hostile requests"
    lines = [
        f"# Soak: {r.users} users for {r.seconds / 60:g} min, {every}",
        "",
        "```bash",
        r.command,
        "```",
        "",
        f"* Server: {r.host}, model `{r.model.name}` (vocabulary {r.model.vocab_size:,}, "
        f"context {r.model.context_len:,} tokens)",
        f"* Machine: {machine}; load average at the end {load or '-'}",
        f"* Started {_iso(r.started)}; {r.duration_s:.0f} s to the last request's end (drain included)",
        f"* Load: {', '.join(f'{k} {v}' for k, v in r.settings.items())}",
        *(f"* {note}" for note in r.notes),
        "",
        f"**{'PASSED' if r.passed else 'FAILED'}**"
        + "".join(f"\n* {p}" for p in r.problems())
        + "".join(f"\n* warning: {w}" for w in r.warnings()),
        "",
        "| normal requests | failed | output tokens | tokens/s | req/s | latency p50 / p90 / p99 ms "
        "| TTFT p50 / p90 / p99 ms |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| {n.requests:,} | {n.failures} | {n.output_tokens:,} | {n.tokens_per_s:.1f} | {n.req_per_s:.2f} "
        f"| {n.latency.cell()} | {n.ttft.cell()} |",
        "",
    ]
    heads = list(OUTCOME_HEADERS.values())
    lines += [
        f"Hostile requests: {h.sent:,} sent, answered in {h.latency.cell()} ms (p50 / p90 / p99).",
        "",
        "| case | expected | sent | " + " | ".join(heads) + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in heads) + " |",
    ]
    for c in [*h.cases, CaseTally("**all**", "", h.outcomes)]:
        counts = " | ".join(str(c.outcomes.get(o.value, 0) or "") for o in OUTCOME_HEADERS)
        expected = OUTCOME_HEADERS[Outcome(c.expected)] if c.expected else ""
        lines.append(f"| {c.name} | {expected} | {c.sent} | {counts} |")
    if h.failed:
        lines += [
            "",
            "Hostile requests the server broke on (seconds from the start):",
            "",
            "| at s | case | status | outcome |",
            "| --- | --- | --- | --- |",
        ]
        lines += [
            f"| {s.start - r.started:.1f} | {s.name} | {s.status} | {s.outcome} |" for s in h.failed[:LISTED_FAILURES]
        ]
        if len(h.failed) > LISTED_FAILURES:
            lines.append(f"| | and {len(h.failed) - LISTED_FAILURES} more (summary.json) | | |")
    lines += [
        "",
        f"Health (`GET /health` every {hl.interval_s:g} s from a thread of its own): {hl.polls} polls, "
        f"{hl.failed} failed{_at(hl.failed_at, r.started, hl.failed_status)}, longest unhealthy stretch "
        f"{hl.longest_unhealthy_s:.0f} s.",
        "",
        f"Greedy reference ({r.greedy.max_tokens} tokens of {r.greedy.prompt!r}), after the run against "
        f"before it: {r.greedy.describe()}.",
        "",
    ]
    return "\n".join(lines)


def write_report(report: SoakReport, out: Path) -> tuple[Path, Path]:
    summary, md = out / SUMMARY_JSON, out / SOAK_MD
    summary.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
    md.write_text(markdown(report), encoding="utf-8")
    return summary, md
