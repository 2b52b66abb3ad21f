"""``requests.jsonl``: one line per measured request of an `echo-bench serve` run, beside
``serve.json``, with what ``serve.json`` leaves out (each request's inter-token latencies).

Each line: ``config``, ``repeat`` (the pass), ``level`` (the request rate, or the concurrency),
``concurrency`` and ``request_rate`` (None in closed-loop levels), ``prompt_id``, ``dataset``,
``prompt_tokens`` (None where neither the prompt nor the server told), ``output_tokens``,
``latency_s``, ``ttft_s`` and ``itl_s`` (None / [] unless streamed), ``verify_steps`` and ``mat``
(None where the server does not report verify steps). A rate of ``inf`` is written as the string
``"inf"``, as in ``serve.json``: JSON has no infinity.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .serve_run import Run


def json_ready(obj: Any) -> Any:
    """``obj`` with every non-finite float as a string (``"inf"``, ``"-inf"``, ``"nan"``)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    return obj


def request_rows(runs: Iterable[Run]) -> Iterator[dict]:
    """One row per request of every run, in run order."""
    for r in runs:
        for q in r.per_request:
            yield {
                "config": r.config,
                "repeat": r.repeat,
                "level": r.level,
                "concurrency": r.concurrency,
                "request_rate": r.request_rate,
                "prompt_id": q.get("prompt_id"),
                "dataset": q.get("dataset"),
                "prompt_tokens": q.get("prompt_tokens"),
                "output_tokens": q.get("tokens"),
                "latency_s": q.get("seconds"),
                "ttft_s": q.get("ttft"),
                "itl_s": q.get("itl") or [],
                "verify_steps": q.get("verify_ct") or None,
                "mat": q.get("mat"),
            }


def write_requests(runs: Iterable[Run], path: Path) -> int:
    """Write :func:`request_rows` to ``path`` as JSON lines; how many were written."""
    n = 0
    with open(path, "w") as fh:
        for row in request_rows(runs):
            fh.write(json.dumps(json_ready(row), allow_nan=False) + "\n")
            n += 1
    return n
