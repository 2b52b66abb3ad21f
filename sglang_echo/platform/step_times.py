"""The scheduler's forward time per step kind and batch size, logged by every CPU-platform server
(``SGLANG_ECHO_STEP_TIMES=1``), speculative or not.

Whole-run tokens/s mixes what a decode step costs with prefills and the host's drift. This
measures the step itself on both sides of a comparison: sglang's decode step in a server without
speculation, ECHO's step (draft, verify, draft extend) in an ECHO server, each at every batch size.
``Scheduler.run_batch`` is timed through sglang's HookRegistry (an AROUND hook), and every
``LOG_EVERY_S`` seconds the running totals go to the server log as one ``echo-step-times`` JSON
line; :func:`read_step_times` takes the last such line of a log.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Optional

logger = logging.getLogger(__name__)

ENV = "SGLANG_ECHO_STEP_TIMES"
TAG = "echo-step-times"
LOG_EVERY_S = 10.0
RUN_BATCH = "sglang.srt.managers.scheduler.Scheduler.run_batch"


class StepTimes:
    """Running ``[steps, seconds]`` per ``(kind, batch size)``: kind ``decode`` (decode and target
    verify: one scheduler step of generation) or ``prefill`` (any extend)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.totals: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0, 0.0])
        self._logged = clock()

    def add(self, kind: str, batch_size: int, seconds: float) -> None:
        cell = self.totals[(kind, batch_size)]
        cell[0] += 1
        cell[1] += seconds

    def snapshot(self) -> dict[str, dict[str, list[float]]]:
        """``{kind: {batch size: [steps, seconds]}}`` (JSON keys are strings)."""
        out: dict[str, dict[str, list[float]]] = defaultdict(dict)
        for (kind, bs), (n, s) in sorted(self.totals.items()):
            out[kind][str(bs)] = [int(n), round(s, 6)]
        return dict(out)

    def due(self) -> bool:
        now = self.clock()
        if now - self._logged < LOG_EVERY_S:
            return False
        self._logged = now
        return True


_TIMES = StepTimes()


def _timed_run_batch(original: Callable[..., Any], scheduler: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    t0 = time.perf_counter()
    result = original(scheduler, batch, *args, **kwargs)
    mode = batch.forward_mode
    kind = "decode" if mode.is_decode() or mode.is_target_verify() else "prefill" if mode.is_extend() else None
    if kind is not None:
        _TIMES.add(kind, len(batch.reqs), time.perf_counter() - t0)
        if _TIMES.due():
            logger.info("%s %s", TAG, json.dumps(_TIMES.snapshot()))
    return result


def register(hooks: Any, around: Any) -> None:
    """Time every scheduler step when ``SGLANG_ECHO_STEP_TIMES`` is set (``hooks``: sglang's HookRegistry)."""
    if os.environ.get(ENV, "0") not in ("", "0"):
        hooks.register(RUN_BATCH, _timed_run_batch, around)


def read_step_times(log: Path) -> Optional[dict[str, dict[str, list[float]]]]:
    """The last step-times line of a server log (None if it has none)."""
    last = None
    with open(log, errors="replace") as fh:
        for line in fh:
            if TAG in line:
                last = line
    return None if last is None else json.loads(last.split(TAG, 1)[1])


def compare(logs: dict[str, Path], kind: str = "decode", min_steps: int = 20) -> str:
    """A Markdown table of ms per ``kind`` step at each batch size, per labelled server log, with
    each column's ratio to the first (the batch sizes every log saw at least ``min_steps`` times)."""
    times = {label: (read_step_times(path) or {}).get(kind, {}) for label, path in logs.items()}
    sizes = sorted({int(b) for t in times.values() for b in t}, key=int)
    sizes = [b for b in sizes if all(t.get(str(b), [0])[0] >= min_steps for t in times.values())]
    labels = list(times)
    rows = [f"| batch | {' | '.join(labels)} |", "| --- |" + " --- |" * len(labels)]
    for b in sizes:
        ms = [1e3 * times[lb][str(b)][1] / times[lb][str(b)][0] for lb in labels]
        cells = [f"{m:.1f}" + ("" if i == 0 else f" ({m / ms[0]:.3f}x)") for i, m in enumerate(ms)]
        rows.append(f"| {b} | {' | '.join(cells)} |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m sglang_echo.platform.step_times none=LOG echo=LOG ...
    import sys

    print(compare({arg.split("=", 1)[0]: Path(arg.split("=", 1)[1]) for arg in sys.argv[1:]}))
