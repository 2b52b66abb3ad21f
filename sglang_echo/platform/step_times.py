"""The scheduler's forward time per step kind and batch size, logged by every CPU-platform server
(``SGLANG_ECHO_STEP_TIMES=1``), speculative or not.

Whole-run tokens/s mixes what a decode step costs with prefills and the host's drift. This
measures the step itself on both sides of a comparison: sglang's decode step in a server without
speculation, ECHO's step (draft, verify, draft extend) in an ECHO server, each at every batch size.
``Scheduler.run_batch`` is timed through sglang's HookRegistry (an AROUND hook). A daemon thread
of the scheduler process writes the running totals to the server log as one ``echo-step-times``
JSON line every ``LOG_EVERY_S`` seconds in which they changed, so the last line holds every step
up to ``LOG_EVERY_S`` after the server went idle; :func:`read_step_times` takes that line, and
:func:`delta` what a stretch of work (one benchmark level) added to it.

The target model's own forward (``ModelRunner._forward_raw`` of the target, decode or target
verify) is timed as kind ``target_forward``, so a comparison can split a step into the forward,
which both servers run on the same tokens when ECHO decodes plainly, and the rest (sampling or
acceptance, drafting, bookkeeping). Its prefill forwards are kind ``target_prefill``: what a
speculative server's prefill adds beyond them is mostly the draft model's extend over the prompt.
Draft-model forwards are left out: they are the rest.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Optional

logger = logging.getLogger(__name__)

ENV = "SGLANG_ECHO_STEP_TIMES"
TAG = "echo-step-times"
LOG_EVERY_S = 1.0
RUN_BATCH = "sglang.srt.managers.scheduler.Scheduler.run_batch"
FORWARD_RAW = "sglang.srt.model_executor.model_runner.ModelRunner._forward_raw"  # a ragged verify: its compacted batch

# {kind: {batch size (a string: JSON keys): [steps, seconds]}}
Snapshot = dict[str, dict[str, list[float]]]


class StepTimes:
    """Running ``[steps, seconds]`` per ``(kind, batch size)``: kind ``decode`` (decode and target
    verify: one scheduler step of generation) or ``prefill`` (any extend). Thread safe: the
    scheduler thread adds, the flusher thread takes snapshots."""

    def __init__(self) -> None:
        self.totals: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0, 0.0])
        self._lock = threading.Lock()
        self._changed = False

    def add(self, kind: str, batch_size: int, seconds: float) -> None:
        with self._lock:
            cell = self.totals[(kind, batch_size)]
            cell[0] += 1
            cell[1] += seconds
            self._changed = True

    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._snapshot()

    def take_changed(self) -> Optional[Snapshot]:
        """The snapshot if anything was added since the last call, else None."""
        with self._lock:
            if not self._changed:
                return None
            self._changed = False
            return self._snapshot()

    def _snapshot(self) -> Snapshot:
        out: dict[str, dict[str, list[float]]] = defaultdict(dict)
        for (kind, bs), (n, s) in sorted(self.totals.items()):
            out[kind][str(bs)] = [int(n), round(s, 6)]
        return dict(out)


_TIMES = StepTimes()
_flusher_pid: Optional[int] = None


def flush() -> None:
    """Log the totals if they changed since the last flush."""
    snap = _TIMES.take_changed()
    if snap is not None:
        logger.info("%s %s", TAG, json.dumps(snap))


def _flush_forever() -> None:
    while True:
        time.sleep(LOG_EVERY_S)
        flush()


def _start_flusher() -> None:
    """One flusher thread per process that times steps (threads do not survive sglang's fork of
    its scheduler, so the scheduler starts its own on its first step)."""
    global _flusher_pid
    if _flusher_pid != os.getpid():
        _flusher_pid = os.getpid()
        threading.Thread(target=_flush_forever, name="echo-step-times", daemon=True).start()


def _is_decode_step(mode: Any) -> bool:
    """A step of generation: a decode, or a speculative server's target verify."""
    return mode.is_decode() or mode.is_target_verify()


def _timed_run_batch(original: Callable[..., Any], scheduler: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    t0 = time.perf_counter()
    result = original(scheduler, batch, *args, **kwargs)
    mode = batch.forward_mode
    kind = "decode" if _is_decode_step(mode) else "prefill" if mode.is_extend() else None
    if kind is not None:
        _TIMES.add(kind, len(batch.reqs), time.perf_counter() - t0)
        _start_flusher()
    return result


def _timed_target_forward(
    original: Callable[..., Any], runner: Any, forward_batch: Any, *args: Any, **kwargs: Any
) -> Any:
    mode = forward_batch.forward_mode
    kind = "target_forward" if _is_decode_step(mode) else "target_prefill" if mode.is_extend() else None
    if getattr(runner, "is_draft_worker", False) or kind is None:
        return original(runner, forward_batch, *args, **kwargs)
    t0 = time.perf_counter()
    result = original(runner, forward_batch, *args, **kwargs)
    _TIMES.add(kind, forward_batch.batch_size, time.perf_counter() - t0)
    return result


def register(hooks: Any, around: Any) -> None:
    """Time every scheduler step and target forward when ``SGLANG_ECHO_STEP_TIMES`` is set
    (``hooks``: sglang's HookRegistry)."""
    if os.environ.get(ENV, "0") not in ("", "0"):
        hooks.register(RUN_BATCH, _timed_run_batch, around)
        hooks.register(FORWARD_RAW, _timed_target_forward, around)


def read_step_times(log: Path) -> Optional[Snapshot]:
    """The last step-times line of a server log (None if it has none)."""
    last = None
    with open(log, errors="replace") as fh:
        for line in fh:
            if TAG in line:
                last = line
    return None if last is None else json.loads(last.split(TAG, 1)[1])


def delta(before: Optional[Snapshot], after: Optional[Snapshot]) -> Snapshot:
    """What happened between two snapshots of one server (cells that did not change left out)."""
    before = before or {}
    out: dict[str, dict[str, list[float]]] = {}
    for kind, cells in (after or {}).items():
        for bs, (n, s) in cells.items():
            n0, s0 = before.get(kind, {}).get(bs, [0, 0.0])
            if n > n0:
                out.setdefault(kind, {})[bs] = [int(n - n0), round(s - s0, 6)]
    return out


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
