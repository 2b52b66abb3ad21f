"""echo-bench serve's load shapes and latency maths: Poisson arrivals, closed and open loops with a
cap, percentiles, TTFT / ITL from streamed chunks, and the per-request JSONL."""

from __future__ import annotations

import json
import math
import threading
import time

import numpy as np
import pytest

from sglang_echo.bench.arrivals import parse_rates, poisson_arrivals
from sglang_echo.bench.latency import latency_summary, percentiles, stream_timing
from sglang_echo.bench.load import Level, run_level
from sglang_echo.bench.requests_log import json_ready, request_rows, write_requests
from sglang_echo.bench.serve_run import Run


def test_poisson_arrivals_are_seeded_with_the_rate_as_their_mean():
    a = poisson_arrivals(20000, 4.0, seed=7)
    assert np.array_equal(a, poisson_arrivals(20000, 4.0, seed=7))  # every config and pass: the same schedule
    assert not np.array_equal(a, poisson_arrivals(20000, 4.0, seed=8))
    gaps = np.diff(a)
    assert a[0] == 0 and len(a) == 20000 and (gaps > 0).all()  # the first request at once, as sglang's
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)  # mean gap 1 / rate
    assert gaps.std() == pytest.approx(0.25, rel=0.05)  # exponential: standard deviation = mean
    assert 19999 / a[-1] == pytest.approx(4.0, rel=0.03)
    assert len(poisson_arrivals(1, 2.0)) == 1 and len(poisson_arrivals(0, 2.0)) == 0
    # a rate scales the same draws: twice the rate, half the gaps
    assert np.allclose(poisson_arrivals(50, 8.0, seed=1), poisson_arrivals(50, 4.0, seed=1) / 2)
    assert np.array_equal(poisson_arrivals(5, math.inf), np.zeros(5))
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError):
            poisson_arrivals(3, bad)


def test_rates_parse_with_inf_and_reject_non_positive():
    assert parse_rates("0.5,4,inf") == [0.5, 4.0, math.inf]
    for bad, why in (("0", "must be > 0"), ("-2", "must be > 0"), ("nan", "must be > 0"), ("x", "a number")):
        with pytest.raises(ValueError, match=why):
            parse_rates(bad)


class _Tracker:
    """A fake request: records when it started and how many ran at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.lock = seconds, threading.Lock()
        self.running = self.most = 0
        self.starts: dict[int, float] = {}

    def __call__(self, i: int) -> int:
        with self.lock:
            self.starts[i] = time.perf_counter()
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(self.seconds)
        with self.lock:
            self.running -= 1
        return i * 10


def test_closed_loop_keeps_concurrency_requests_in_flight():
    t = _Tracker(0.02)
    seconds, results = run_level(t, 8, 2)
    assert results == [i * 10 for i in range(8)] and t.most == 2
    assert seconds >= 4 * 0.02  # 8 requests, 2 at a time


def test_open_loop_sends_on_schedule_and_respects_the_cap():
    t = _Tracker(0.0)
    t0 = time.perf_counter()
    arrivals = [0.0, 0.05, 0.1, 0.1]
    seconds, results = run_level(t, 4, 4, arrivals)
    assert results == [0, 10, 20, 30] and seconds >= 0.1
    for i, at in enumerate(arrivals):
        assert t.starts[i] - t0 >= at - 1e-3  # never before its arrival
    capped = _Tracker(0.03)
    run_level(capped, 6, 2, [0.0] * 6)  # all arrive at once, at most 2 in flight: the rest wait
    assert capped.most == 2


def test_a_failed_request_fails_the_level():
    def send(i: int) -> int:
        if i == 2:
            raise RuntimeError("boom")
        return i

    with pytest.raises(RuntimeError, match="boom"):
        run_level(send, 4, 2)


def test_levels_are_known_by_rate_or_concurrency():
    assert Level(8).key == 8 and Level(8).label == "c=8"
    assert Level(64, 2.5).key == 2.5 and Level(64, 2.5).label == "2.5 req/s"
    assert Level(64, math.inf).label == "inf req/s"


def test_percentiles_interpolate_between_ranks():
    p = percentiles(range(1, 101))
    assert (p["n"], p["mean"]) == (100, 50.5)
    assert (p["p50"], p["p90"], p["p99"]) == pytest.approx((50.5, 90.1, 99.01))
    assert percentiles([3.0]) == {"n": 1, "mean": 3.0, "p50": 3.0, "p90": 3.0, "p99": 3.0}
    assert percentiles([]) is None


def test_stream_timing_spreads_a_chunks_gap_over_its_tokens():
    # start 0; token 1 at 0.1, token 2 at 0.2, a meta-only chunk, then 3 tokens at once at 0.5
    timing = stream_timing(0.0, [0.1, 0.2, 0.3, 0.5], [1, 2, 2, 5])
    assert timing.ttft == pytest.approx(0.1)
    assert timing.itl == pytest.approx([0.1, 0.1, 0.1, 0.1])  # (0.5 - 0.2) / 3 each: from the last token
    first_brings_two = stream_timing(1.0, [1.2, 1.5], [2, 3])
    assert first_brings_two.ttft == pytest.approx(0.2) and first_brings_two.itl == pytest.approx([0.3])
    assert stream_timing(0.0, [0.1], [0]).ttft is None and stream_timing(0.0, [], []).itl == []


def test_latency_summary_of_a_level():
    records = [
        {"seconds": 1.0, "tokens": 5, "ttft": 0.2, "itl": [0.2, 0.2, 0.2, 0.2]},
        {"seconds": 3.0, "tokens": 3, "ttft": 1.0, "itl": [1.0, 1.0]},
        {"seconds": 2.0, "tokens": 1, "ttft": 0.5, "itl": []},
    ]
    s = latency_summary(records, seconds=4.0)
    assert s["requests_per_s"] == pytest.approx(0.75)
    assert s["e2e"]["p50"] == pytest.approx(2.0) and s["ttft"]["p50"] == pytest.approx(0.5)
    assert s["itl"]["n"] == 6 and s["itl"]["p50"] == pytest.approx(0.2)  # pooled over the requests
    assert s["tpot"]["n"] == 2 and s["tpot"]["mean"] == pytest.approx((0.2 + 1.0) / 2)
    unstreamed = latency_summary([{"seconds": 1.0, "tokens": 4}], 1.0)
    assert unstreamed["ttft"] is None and unstreamed["itl"] is None and unstreamed["e2e"]["n"] == 1


def _run(rate: float | None) -> Run:
    reqs = [
        {
            "tokens": 4,
            "verify_ct": 2,
            "mat": 2.0,
            "dataset": "tokens",
            "seconds": 0.5,
            "prompt_id": "tokens/0",
            "prompt_tokens": 16,
            "ttft": 0.1,
            "itl": [0.1, 0.1, 0.2],
        },
        {
            "tokens": 3,
            "verify_ct": 0,
            "mat": None,
            "dataset": "chat",
            "seconds": 0.4,
            "prompt_id": "chat/1",
            "prompt_tokens": None,
            "ttft": None,
            "itl": [],
        },
    ]
    return Run("echo", 64, 2, 1.0, 7, 2, True, per_request=reqs, repeat=1, request_rate=rate)


def test_requests_jsonl_has_one_strict_json_line_per_request(tmp_path):
    path = tmp_path / "requests.jsonl"
    assert write_requests([_run(math.inf), _run(None)], path) == 4

    def no_constants(name: str):
        raise AssertionError(f"non-standard JSON constant {name}")

    rows = [json.loads(line, parse_constant=no_constants) for line in path.read_text().splitlines()]
    assert rows[0] == {
        "config": "echo",
        "repeat": 1,
        "level": "inf",
        "concurrency": 64,
        "request_rate": "inf",
        "prompt_id": "tokens/0",
        "dataset": "tokens",
        "prompt_tokens": 16,
        "output_tokens": 4,
        "latency_s": 0.5,
        "ttft_s": 0.1,
        "itl_s": [0.1, 0.1, 0.2],
        "verify_steps": 2,
        "mat": 2.0,
    }
    assert rows[1]["verify_steps"] is None and rows[1]["ttft_s"] is None and rows[1]["itl_s"] == []
    assert rows[2]["level"] == 64 and rows[2]["request_rate"] is None  # a closed-loop level: its concurrency
    assert [r["prompt_id"] for r in request_rows([_run(2.0)])] == ["tokens/0", "chat/1"]
    assert json_ready({"a": [math.inf, -math.inf, 1.5]}) == {"a": ["inf", "-inf", 1.5]}
