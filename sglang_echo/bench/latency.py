"""Latency of served requests: time to first token (TTFT), inter-token latency (ITL), end-to-end
latency, and their percentiles over a level.

A streamed request's chunks arrive at ``t_1 <= t_2 <= ...`` holding ``k_1 <= k_2 <= ...`` output
tokens in all. TTFT is ``t_j - start`` for the first chunk with a token. A later chunk that brings
``d = k_i - k_prev > 0`` tokens after the previous chunk with tokens contributes ``d`` ITLs of
``(t_i - t_prev) / d`` each: a speculative step commits several tokens in one chunk, and spreading
its gap over them keeps the mean ITL equal to the decode time per token (as sglang's
``bench_serving`` counts it). Tokens that come with the first chunk have no gap of their own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

PERCENTILES = (50, 90, 99)


def percentiles(values: Iterable[float], ps: Sequence[float] = PERCENTILES) -> dict[str, float] | None:
    """``{"p50": ..., ...}`` of ``values`` by linear interpolation between closest ranks (numpy's
    default, the one ``serve_tables.quartiles`` uses too), plus ``n`` and ``mean``; None if empty."""
    v = np.asarray(list(values), dtype=float)
    if v.size == 0:
        return None
    qs = np.percentile(v, ps)
    return {"n": int(v.size), "mean": float(v.mean()), **{f"p{p:g}": float(q) for p, q in zip(ps, qs)}}


@dataclass(frozen=True)
class StreamTiming:
    """One streamed request's TTFT (None: no token came) and ITLs, in seconds."""

    ttft: float | None
    itl: list[float]


def stream_timing(start: float, chunk_times: Sequence[float], chunk_tokens: Sequence[int]) -> StreamTiming:
    """TTFT and ITLs of one request from its chunks' arrival times and cumulative token counts."""
    t = np.asarray(chunk_times, dtype=float)
    k = np.asarray(chunk_tokens, dtype=np.int64)
    arrived = np.diff(k, prepend=0) > 0  # chunks that brought tokens (a chunk may carry only meta_info)
    if not arrived.any():
        return StreamTiming(None, [])
    t, k = t[arrived], k[arrived]
    new = np.diff(k)
    return StreamTiming(float(t[0] - start), np.repeat(np.diff(t) / new, new).tolist())


def latency_summary(records: Sequence[dict], seconds: float) -> dict:
    """A level's latency figures from its per-request records (``seconds``: end-to-end latency;
    ``ttft`` and ``itl`` where the request was streamed) and its wall ``seconds``: request
    throughput and the percentiles of end-to-end latency, TTFT and ITL (ITLs pooled over the
    level's requests), in seconds. A figure no request has is None."""
    itl = [x for r in records for x in (r.get("itl") or [])]
    streamed = [r for r in records if r.get("ttft") is not None and r.get("seconds") is not None]
    return {
        "requests_per_s": len(records) / seconds if seconds > 0 else None,
        "e2e": percentiles(r["seconds"] for r in records if r.get("seconds") is not None),
        "ttft": percentiles(r["ttft"] for r in streamed),
        "itl": percentiles(itl),
        # time per output token after the first, per request (bench_serving's TPOT)
        "tpot": percentiles((r["seconds"] - r["ttft"]) / (r["tokens"] - 1) for r in streamed if r["tokens"] > 1),
    }


def quartiles(values: list[float]) -> dict | None:
    """n, mean, 5/25/50/75/95th percentiles (ECHO Fig. 4's box and whiskers); None if empty."""
    p = percentiles(values, (5, 25, 50, 75, 95))
    if p is None:
        return None
    return {
        "n": p["n"],
        "mean": p["mean"],
        "p5": p["p5"],
        "q1": p["p25"],
        "median": p["p50"],
        "q3": p["p75"],
        "p95": p["p95"],
    }
