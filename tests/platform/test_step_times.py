"""The scheduler step timer (platform.step_times): the hook times run_batch by step kind and batch
size, logs its totals, and the comparison reads them back from server logs."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

from sglang_echo.platform import step_times


def _batch(mode: str, bs: int):
    kinds = {
        "decode": (True, False, False),
        "verify": (False, True, True),
        "extend": (False, False, True),
        "idle": (False, False, False),
    }
    decode, verify, extend = kinds[mode]
    forward_mode = SimpleNamespace(is_decode=lambda: decode, is_target_verify=lambda: verify, is_extend=lambda: extend)
    return SimpleNamespace(forward_mode=forward_mode, reqs=[None] * bs)


def test_run_batch_is_timed_by_kind_and_batch_size(monkeypatch, caplog):
    times = step_times.StepTimes()
    monkeypatch.setattr(step_times, "_TIMES", times)
    monkeypatch.setattr(step_times, "_start_flusher", lambda: None)  # flushed by hand below
    calls = []

    def run_batch(scheduler, batch):
        calls.append(batch)
        return "result"

    with caplog.at_level(logging.INFO, logger=step_times.__name__):
        for mode, bs in [("decode", 8), ("verify", 8), ("extend", 3), ("idle", 0)]:
            assert step_times._timed_run_batch(run_batch, object(), _batch(mode, bs)) == "result"
        step_times.flush()
        step_times.flush()  # nothing new: no second line
    assert len(calls) == 4
    snap = times.snapshot()
    assert snap["decode"]["8"][0] == 2 and snap["prefill"]["3"][0] == 1 and set(snap) == {"decode", "prefill"}
    lines = [r.getMessage() for r in caplog.records if step_times.TAG in r.getMessage()]
    assert len(lines) == 1 and '"8": [2,' in lines[0]


def test_the_flusher_logs_the_last_steps_without_another_step(monkeypatch, caplog):
    """The last totals reach the log although no step follows them (the level ended)."""
    monkeypatch.setattr(step_times, "_TIMES", step_times.StepTimes())
    monkeypatch.setattr(step_times, "LOG_EVERY_S", 0.01)
    monkeypatch.setattr(step_times, "_flusher_pid", None)
    with caplog.at_level(logging.INFO, logger=step_times.__name__):
        step_times._timed_run_batch(lambda s, b: None, object(), _batch("decode", 4))
        deadline = time.monotonic() + 5
        while not any(step_times.TAG in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
            time.sleep(0.01)
    assert any('"decode": {"4": [1,' in r.getMessage() for r in caplog.records)


def test_delta_is_what_a_level_added():
    before = {"decode": {"8": [10, 1.0]}, "prefill": {"2": [1, 0.5]}}
    after = {"decode": {"8": [15, 1.75], "4": [2, 0.2]}, "prefill": {"2": [1, 0.5]}}
    assert step_times.delta(before, after) == {"decode": {"8": [5, 0.75], "4": [2, 0.2]}}
    assert step_times.delta(None, after)["prefill"] == {"2": [1, 0.5]}


def test_compare_reads_the_last_line_of_each_log(tmp_path):
    def log(name, lines):
        path = tmp_path / name
        path.write_text("".join(f"[t] INFO {step_times.TAG} {line}\n" for line in lines) + "[t] other line\n")
        return path

    none = log("none.log", ['{"decode": {"8": [10, 1.0]}}', '{"decode": {"8": [40, 2.0], "9": [5, 1.0]}}'])
    echo = log("echo.log", ['{"decode": {"8": [40, 2.2], "9": [40, 3.0]}, "prefill": {"1": [3, 0.1]}}'])
    assert step_times.read_step_times(none) == {"decode": {"8": [40, 2.0], "9": [5, 1.0]}}
    table = step_times.compare({"none": none, "echo": echo})
    assert "| 8 | 50.0 | 55.0 (1.100x) |" in table
    assert "| 9 |" not in table  # too few steps in one of the logs


def test_the_target_forward_is_timed_apart_from_draft_forwards(monkeypatch):
    """Kind ``target_forward``: the target runner's decode and verify forwards, by batch size; kind
    ``target_prefill``: its extends. The draft runner's forwards are not timed."""
    times = step_times.StepTimes()
    monkeypatch.setattr(step_times, "_TIMES", times)
    target, draft = SimpleNamespace(is_draft_worker=False), SimpleNamespace(is_draft_worker=True)

    def forward_raw(runner, forward_batch, *args, **kwargs):
        return (runner, args, kwargs)

    for runner, mode, bs in [
        (target, "decode", 8),
        (target, "verify", 8),
        (target, "verify", 5),
        (target, "extend", 3),
        (draft, "decode", 8),
        (draft, "extend", 8),
    ]:
        batch = _batch(mode, bs)
        batch.batch_size = bs
        assert step_times._timed_target_forward(forward_raw, runner, batch, None, split_forward_count=1) == (
            runner,
            (None,),
            {"split_forward_count": 1},
        )
    snap = times.snapshot()
    assert set(snap) == {"target_forward", "target_prefill"}
    assert {bs: n for bs, (n, _) in snap["target_forward"].items()} == {"8": 2, "5": 1}
    assert {bs: n for bs, (n, _) in snap["target_prefill"].items()} == {"3": 1}
