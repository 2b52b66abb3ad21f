"""One row of figures per concurrency level, from that level's samples; and the CSV files."""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from .measure import Sample

SUMMARY_CSV = "summary.csv"
ERRORS_CSV = "errors.csv"


@dataclass(frozen=True)
class LevelResult:
    """Throughput counts successful requests only; latencies are over successful requests."""

    users: int
    stopped_by: str  # "requests" (the level's request budget) or "time"
    requests: int  # finished requests, failed ones included
    failures: int
    duration_s: float  # first request's start to last request's end
    req_per_s: float
    output_tokens: int
    tokens_per_s: float
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    tpot_p50_ms: float | None
    tpot_p95_ms: float | None
    client_cpu_warning: bool  # locust itself ran out of CPU: the figures understate the server
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def failure_rate(self) -> float:
        return self.failures / self.requests if self.requests else 0.0


def _ms_percentiles(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    present = [v for v in values if v is not None]
    if not present:
        return None, None
    p50, p95 = np.percentile(np.asarray(present) * 1e3, [50, 95])
    return float(p50), float(p95)


def summarise(
    users: int, samples: Sequence[Sample], *, request_budget: int, client_cpu_warning: bool = False
) -> LevelResult:
    ok = [s for s in samples if s.ok]
    duration = max(s.end for s in samples) - min(s.start for s in samples) if samples else 0.0
    tokens = sum(s.output_tokens for s in ok)

    def rate(n: float) -> float:
        return n / duration if duration > 0 else 0.0

    lat = _ms_percentiles([s.latency_s for s in ok])
    ttft = _ms_percentiles([s.ttft_s for s in ok])
    tpot = _ms_percentiles([s.tpot_s for s in ok])
    return LevelResult(
        users=users,
        stopped_by="requests" if len(samples) >= request_budget else "time",
        requests=len(samples),
        failures=len(samples) - len(ok),
        duration_s=duration,
        req_per_s=rate(len(ok)),
        output_tokens=tokens,
        tokens_per_s=rate(tokens),
        latency_p50_ms=lat[0],
        latency_p95_ms=lat[1],
        ttft_p50_ms=ttft[0],
        ttft_p95_ms=ttft[1],
        tpot_p50_ms=tpot[0],
        tpot_p95_ms=tpot[1],
        client_cpu_warning=client_cpu_warning,
        errors=dict(sorted(Counter(s.error for s in samples if s.error).items())),
    )


def _cell(value: object) -> object:
    if value is None:
        return ""  # no such measurement (e.g. no streaming request succeeded)
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, dict):  # errors, readable in one cell: "connection=2 http_500=5"
        return " ".join(f"{k}={v}" for k, v in value.items())
    return value


def write_csvs(results: Sequence[LevelResult], out: Path) -> tuple[Path, Path]:
    """``summary.csv`` (a row per level) and ``errors.csv`` (users, kind, count; tidy form)."""
    summary, errors = out / SUMMARY_CSV, out / ERRORS_CSV
    columns = [f.name for f in fields(LevelResult)]
    with open(summary, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        for r in results:
            writer.writerow([_cell(getattr(r, c)) for c in columns])
    with open(errors, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["users", "kind", "count"])
        for r in results:
            writer.writerows([r.users, kind, n] for kind, n in r.errors.items())
    return summary, errors
