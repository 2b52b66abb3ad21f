"""loadtests/: the measurements on their own, then whole sweeps against a fake OpenAI server
(locust for real, no sglang), then one smoke sweep against a real sglang server."""

from __future__ import annotations

import csv
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from loadtests.hostile import battery, send
from loadtests.hosts import RemoteHostRefused, check_host
from loadtests.measure import Sample, measure_json, measure_stream
from loadtests.run import SMOKE, main, parse_args, served_model
from loadtests.soak import served_model as soak_model
from loadtests.summary import summarise

from ..conftest import LOADTEST_PORTS, launch_test_server
from .fake_openai import FakeConfig, FakeOpenAI

TOKENS = 5  # max_tokens of the fake sweeps


def _data(obj: str) -> bytes:
    return f"data: {obj}".encode()


ROLE = _data('{"choices": [{"delta": {"role": "assistant", "content": ""}}]}')
TEXT = _data('{"choices": [{"delta": {"content": "hi"}}]}')
USAGE_5 = _data('{"choices": [], "usage": {"completion_tokens": 5}}')
DONE = _data("[DONE]")


def ticking_clock() -> Iterator[float]:
    """1.0, 2.0, 3.0, ...: each clock() call is one second later."""
    t = 0.0
    while True:
        t += 1.0
        yield t


def measure(lines: list[bytes]):
    clock = ticking_clock()
    return measure_stream(lines, 0.0, clock=lambda: next(clock))


# --- measurements ------------------------------------------------------------------------------


def test_ttft_is_at_the_first_text_chunk_and_tokens_come_from_usage() -> None:
    # Three text chunks at t=1, 2, 3 but five tokens (speculative decoding sends several per
    # chunk): the role-only chunk is not the first token, and TPOT spreads (3-1)s over 4 gaps.
    got = measure([ROLE, b"", TEXT, TEXT, TEXT, USAGE_5, DONE])
    assert (got.error, got.output_tokens, got.ttft_s, got.tpot_s) == (None, 5, 1.0, 0.5)


def test_without_usage_each_text_chunk_is_a_token() -> None:
    got = measure([TEXT, TEXT, TEXT, DONE])
    assert (got.output_tokens, got.ttft_s, got.tpot_s) == (3, 1.0, 1.0)


def test_one_token_has_a_ttft_but_no_tpot() -> None:
    got = measure([TEXT, DONE])
    assert (got.error, got.output_tokens, got.ttft_s, got.tpot_s) == (None, 1, 1.0, None)


def _raising(exc: Exception) -> Iterator[bytes]:
    yield TEXT
    raise exc


@pytest.mark.parametrize(
    ("lines", "kind"),
    [
        ([TEXT, b"data: {not json", DONE], "malformed_sse"),
        ([TEXT, b'data: ["a list"]', DONE], "malformed_sse"),
        ([TEXT, TEXT], "malformed_sse"),  # cut off before [DONE]
        ([TEXT, _data('{"error": {"message": "boom"}}'), DONE], "stream_error"),
        (_raising(requests.ConnectionError("Connection broken")), "connection"),
        (_raising(ConnectionResetError()), "connection"),
        (_raising(requests.ConnectionError("Read timed out.")), "timeout"),
    ],
)
def test_broken_streams_are_errors_of_their_kind(lines, kind: str) -> None:
    got = measure(lines)
    assert got.error == kind and got.ttft_s is None


def test_non_streaming_bodies() -> None:
    assert measure_json(b'{"choices": [{"text": "x"}], "usage": {"completion_tokens": 7}}').output_tokens == 7
    assert measure_json(b"<html>").error == "malformed_json"
    assert measure_json(b'{"choices": []}').error == "malformed_json"


def test_summary_of_a_level() -> None:
    samples = [
        Sample("chat", True, start=100.0, latency_s=1.0, output_tokens=10, ttft_s=0.1, tpot_s=0.02),
        Sample("chat", True, start=100.5, latency_s=1.0, output_tokens=10, ttft_s=0.3, tpot_s=0.04),
        Sample("completions", False, start=101.0, latency_s=3.0, output_tokens=20),
        Sample("chat", True, start=101.0, latency_s=0.1, error="http_500"),
        Sample("chat", False, start=102.0, latency_s=0.1, error="http_500"),
        Sample("chat", True, start=102.0, latency_s=0.1, error="connection"),
    ]
    r = summarise(8, samples, request_budget=6)
    assert (r.users, r.requests, r.failures, r.stopped_by) == (8, 6, 3, "requests")
    assert r.errors == {"connection": 1, "http_500": 2}
    assert r.duration_s == pytest.approx(4.0)  # 100.0 until 104.0
    assert r.output_tokens == 40 and r.tokens_per_s == pytest.approx(10.0)
    assert r.req_per_s == pytest.approx(0.75)  # successful requests only
    assert r.ttft_p50_ms == pytest.approx(200.0) and r.tpot_p50_ms == pytest.approx(30.0)
    assert r.latency_p50_ms == pytest.approx(1000.0)  # failures excluded
    assert summarise(8, samples, request_budget=100).stopped_by == "time"


# --- hosts ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:30000", "http://localhost:8000/", "http://[::1]:30000", "https://127.1.2.3"]
)
def test_loopback_hosts_are_allowed(url: str) -> None:
    assert check_host(url, allow_remote=False) == url.rstrip("/")


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.5:30000",
        "http://sglang.example.com",
        "http://localhost.example.com",
        "ftp://127.0.0.1",
        "127.0.0.1:30000",
    ],
)
def test_other_hosts_need_allow_remote(url: str) -> None:
    with pytest.raises(RemoteHostRefused):
        check_host(url, allow_remote=False)


def test_allow_remote_admits_a_named_server() -> None:
    assert check_host("http://10.0.0.5:30000", allow_remote=True) == "http://10.0.0.5:30000"


def test_runner_refuses_a_remote_host_before_contacting_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["--host", "http://10.255.255.1:30000", "--out", str(out)]) == 2
    assert not out.exists()


def test_runner_stops_when_no_server_answers(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port that was just free: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["--host", f"http://127.0.0.1:{port}", "--out", str(tmp_path / "out")]) == 2


def test_smoke_defaults_yield_to_explicit_options() -> None:
    args = parse_args(["--smoke", "--level-requests", "3"])
    assert args.users == tuple(int(u) for u in SMOKE["users"].split(","))
    assert (args.level_requests, args.max_new_tokens, args.fail_on_errors) == (3, SMOKE["max_new_tokens"], True)
    assert parse_args([]).users == (8, 16, 32, 64, 128, 256)
    assert (parse_args([]).warmup_requests, args.warmup_requests) == (32, 0)


# --- sweeps against the fake server ------------------------------------------------------------


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _sweep(fake: FakeOpenAI, out: Path, *options: str) -> int:
    return main(
        ["--host", fake.url, "--max-new-tokens", str(TOKENS), "--out", str(out), "--warmup-requests", "0", *options]
    )


def test_sweep_writes_csv_and_plot(tmp_path: Path) -> None:
    config = FakeConfig()
    with FakeOpenAI(config) as fake:
        assert (
            _sweep(
                fake,
                tmp_path,
                "--users",
                "2,4",
                "--level-requests",
                "12",
                "--level-seconds",
                "120",
                "--warmup-requests",
                "4",
            )
            == 0
        )
    rows = _rows(tmp_path / "summary.csv")
    assert [int(r["users"]) for r in rows] == [2, 4]
    for r in rows:
        assert (r["requests"], r["failures"], r["stopped_by"], r["errors"]) == ("12", "0", "requests", "")
        assert int(r["output_tokens"]) == 12 * TOKENS
        assert float(r["tokens_per_s"]) == pytest.approx(int(r["output_tokens"]) / float(r["duration_s"]), rel=1e-2)
        # The fake holds every first token back this long; no client can see it sooner.
        assert float(r["ttft_p50_ms"]) >= config.first_token_delay_s * 1e3
        assert float(r["ttft_p95_ms"]) >= float(r["ttft_p50_ms"])
        assert float(r["tpot_p50_ms"]) > 0
    assert fake.served == 4 + 24  # the warm-up's requests were served and left out of every level
    assert fake.flushes == 2  # the prefix cache, before each level
    assert _rows(tmp_path / "errors.csv") == []
    assert (tmp_path / "loadtest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len((tmp_path / "users_004.samples.jsonl").read_text().splitlines()) == 12
    # Locust's own statistics agree on the count and carry the streaming figures too.
    entries = json.loads((tmp_path / "users_002.locust.json").read_text())
    assert sum(e["num_requests"] for e in entries if e["method"] == "POST") == 12
    assert {e["method"] for e in entries} == {"POST", "TTFT", "TPOT"}


def test_max_tokens_jitter_draws_the_same_lengths_at_every_level(tmp_path: Path) -> None:
    with FakeOpenAI(FakeConfig(token_delay_s=0.0)) as fake:
        assert (
            _sweep(
                fake,
                tmp_path,
                "--users",
                "1,2",
                "--level-requests",
                "16",
                "--level-seconds",
                "120",
                "--max-new-tokens-jitter",
                "2",
            )
            == 0
        )

    def lengths(users: int) -> list[int]:
        lines = (tmp_path / f"users_{users:03d}.samples.jsonl").read_text().splitlines()
        return sorted(json.loads(line)["output_tokens"] for line in lines)

    assert lengths(1) == lengths(2)  # one seeded sequence per level, whatever the users' order
    assert set(lengths(1)) <= set(range(TOKENS - 2, TOKENS + 3)) and len(set(lengths(1))) > 1
    with pytest.raises(SystemExit):
        parse_args(["--max-new-tokens-jitter", "-1"])


def test_level_ends_at_its_time_limit(tmp_path: Path) -> None:
    with FakeOpenAI(FakeConfig()) as fake:
        assert (
            _sweep(
                fake,
                tmp_path,
                "--users",
                "2",
                "--level-requests",
                "100000",
                "--level-seconds",
                "2",
                "--keep-cache",
                "--drain-seconds",
                "0",
            )
            == 0
        )
    assert fake.flushes == 0
    (row,) = _rows(tmp_path / "summary.csv")
    assert row["stopped_by"] == "time"
    assert 0 < int(row["requests"]) <= fake.served  # no drain: requests cut off are not samples
    assert row["failures"] == "0"


def test_requests_in_flight_at_the_limit_drain_and_count(tmp_path: Path) -> None:
    # Every request takes ~2.5 s, longer than the 1 s window: without the drain none would count.
    with FakeOpenAI(FakeConfig(first_token_delay_s=0.5, token_delay_s=0.5)) as fake:
        assert (
            _sweep(
                fake,
                tmp_path,
                "--users",
                "3",
                "--level-requests",
                "100000",
                "--level-seconds",
                "1",
                "--keep-cache",
                "--drain-seconds",
                "30",
            )
            == 0
        )
    (row,) = _rows(tmp_path / "summary.csv")
    assert row["stopped_by"] == "time"
    assert int(row["requests"]) == fake.served == 3  # each user's one request, finished and counted
    assert int(row["output_tokens"]) == 3 * TOKENS
    assert float(row["duration_s"]) >= 2.0  # to the last request's end, drain included


@pytest.mark.parametrize(
    ("failure", "kinds"),
    [
        ("500", {"http_500"}),
        ("400", {"http_400"}),
        ("drop", {"connection"}),
        ("malformed", {"malformed_sse", "malformed_json"}),  # streaming and non-streaming requests
    ],
)
def test_errors_are_counted_by_kind(tmp_path: Path, failure: str, kinds: set[str]) -> None:
    with FakeOpenAI(FakeConfig(fail_every=3, failure=failure)) as fake:
        rc = _sweep(
            fake, tmp_path, "--users", "2", "--level-requests", "12", "--level-seconds", "120", "--fail-on-errors"
        )
    assert rc == 1  # --fail-on-errors
    (row,) = _rows(tmp_path / "summary.csv")
    assert (int(row["requests"]), int(row["failures"])) == (12, fake.failed) == (12, 4)
    errors = {r["kind"]: int(r["count"]) for r in _rows(tmp_path / "errors.csv")}
    assert set(errors) <= kinds and sum(errors.values()) == 4
    assert int(row["output_tokens"]) == 8 * TOKENS  # failed requests generate nothing


# --- a real server -----------------------------------------------------------------------------


@pytest.mark.server
def test_smoke_against_sglang(smollm2_dir: Path, tmp_path: Path) -> None:
    srv = launch_test_server(LOADTEST_PORTS, "loadtest", model_path=smollm2_dir, spec="none")
    try:
        assert main(["--host", srv.base_url, "--smoke", "--out", str(tmp_path)]) == 0
        check_hostile_battery(srv.base_url, smollm2_dir)
    finally:
        srv.stop()
    rows = _rows(tmp_path / "summary.csv")
    assert [int(r["users"]) for r in rows] == [int(u) for u in SMOKE["users"].split(",")]
    for r in rows:  # how many requests fit in a level depends on the machine; that any do does not
        assert int(r["requests"]) > 0 and r["failures"] == "0"
        assert 0 < int(r["output_tokens"]) <= int(r["requests"]) * SMOKE["max_new_tokens"]
        assert float(r["ttft_p50_ms"]) > 0 and float(r["tpot_p50_ms"]) > 0


def check_hostile_battery(url: str, model_dir: Path) -> None:
    """The soak's hostile battery, once, against the real server: each case is answered as it
    expects (a 4xx; the disconnecting stream a 200), and the server still serves afterwards."""
    model, notes = soak_model(url, served_model(url), None)  # as a soak finds it
    assert notes == [] and model.context_len == 8192
    # What the battery's out-of-vocabulary ids are chosen against: SmolLM2's vocabulary.
    assert model.vocab_size == json.loads((model_dir / "config.json").read_text())["vocab_size"] == 49152
    answers = {case.name: send(url, case, timeout=120) for case in battery(model)}
    assert {n: (a.status, a.outcome) for n, a in answers.items() if a.outcome != a.expected} == {}
    assert requests.get(f"{url}/health", timeout=60).status_code == 200
