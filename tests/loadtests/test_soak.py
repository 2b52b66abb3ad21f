"""loadtests/soak.py: the health poller and the verdict on their own, then short soaks against the
fake OpenAI server (locust for real, no sglang): the report's accounting against what the fake
served, and the exit status when the fake breaks on the hostile requests."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import replace
from pathlib import Path

import pytest

from loadtests.health import HealthPoller, HealthReport, Poll, health_report
from loadtests.hostile import HostileSample, Outcome, ServedModel, battery
from loadtests.soak import main, served_model
from loadtests.soak_report import GreedyCheck, HostileTraffic, NormalTraffic, Percentiles, SoakReport, markdown

from .fake_openai import MODEL, FakeConfig, FakeOpenAI

CONTEXT = 2048  # the fake's max_model_len
TOKENS = 5


# --- health ----------------------------------------------------------------------------------------


def test_longest_unhealthy_stretch_runs_from_a_failed_poll_to_the_next_good_one() -> None:
    polls = [Poll(0, 0.1, 200), Poll(5, 0.1, 503), Poll(10, 30, 0), Poll(40, 0.1, 200), Poll(45, 0.1, 0)]
    r = health_report(polls, end=47, interval_s=5)
    assert (r.polls, r.failed, r.longest_unhealthy_s, r.first_failure, r.healthy) == (5, 3, 35, 5, False)
    assert r.failed_at == [5, 10, 45]
    assert health_report(polls[-1:], end=60, interval_s=5).longest_unhealthy_s == 15  # unhealthy to the end
    assert health_report(polls[:1], end=60, interval_s=5).healthy
    assert not health_report([], end=60, interval_s=5).healthy  # no poll: nothing says it was healthy


@pytest.mark.parametrize(("status", "healthy"), [(200, True), (503, False)])
def test_the_poller_polls_on_its_schedule(status: int, healthy: bool) -> None:
    """At least four polls come (however slowly a loaded machine runs them), never faster than
    one an interval."""
    with FakeOpenAI(FakeConfig(health_status=status)) as fake:
        start = time.monotonic()
        poller = HealthPoller(fake.url, interval_s=0.1, timeout_s=5).start()
        while fake.health_polls < 4 and time.monotonic() - start < 30:
            time.sleep(0.05)
        report = poller.stop()
        elapsed = time.monotonic() - start
    assert 4 <= report.polls == fake.health_polls <= elapsed / 0.1 + 1
    assert report.healthy is healthy and report.failed == (0 if healthy else report.polls)


# --- the verdict -----------------------------------------------------------------------------------


def _report(**changes) -> SoakReport:
    model = ServedModel(MODEL)
    cases = battery(model)
    samples = [
        HostileSample(c.name, 100.0, 0.01, 200 if c.disconnect else 400, c.expected.value, c.expected.value)
        for c in cases
    ]
    good = SoakReport(
        command="soak",
        machine={},
        host="http://127.0.0.1:1",
        model=model,
        users=8,
        seconds=10,
        settings={},
        started=100.0,
        duration_s=10.0,
        normal=NormalTraffic(40, 0, {}, 200, 20.0, 4.0, Percentiles(1, 2, 3), Percentiles(1, 1, 1), False),
        hostile=HostileTraffic.of(5, cases, samples),
        health=HealthReport(polls=10, failed=0, longest_unhealthy_s=0.0, first_failure=None, interval_s=1.0),
        greedy=GreedyCheck("p", 4, "same", "same", "same"),
    )
    return replace(good, **changes)


def test_a_clean_soak_passes() -> None:
    r = _report()
    assert r.passed and r.problems() == [] == r.warnings() and r.hostile.unexpected == []
    assert "**PASSED**" in markdown(r) and "before it: identical." in markdown(r)


def test_every_kind_of_breakage_fails_the_soak() -> None:
    base = _report()
    cases = battery(ServedModel(MODEL))
    broken = [
        HostileSample("n-huge", 101.0, 0.0, 0, Outcome.CONNECTION.value, "rejected"),
        HostileSample("ids-negative", 102.0, 0.0, 502, Outcome.SERVER_ERROR.value, "rejected"),
    ]
    reports = {
        "normal": replace(base, normal=replace(base.normal, failures=1, errors={"http_500": 1})),
        "hostile": replace(base, hostile=HostileTraffic.of(5, cases, broken)),
        "health": replace(base, health=replace(base.health, failed=1, longest_unhealthy_s=5.0, failed_at=[153.0])),
        "greedy gone": replace(base, greedy=GreedyCheck("p", 4, "same", "same", None)),
    }
    for kind, r in reports.items():
        assert not r.passed and len(r.problems()) == 1, kind
    assert "ids-negative, n-huge" in reports["hostile"].problems()[0]
    assert "| 2.0 | ids-negative | 502 | server_error |" in markdown(reports["hostile"])
    assert "1 failed (at 53 s), longest unhealthy stretch 5 s" in markdown(reports["health"])


def test_a_hostile_request_the_server_ran_is_reported_not_failed() -> None:
    ran = [HostileSample("n-huge", 101.0, 0.5, 200, Outcome.ACCEPTED.value, "rejected")]
    r = _report(hostile=HostileTraffic.of(5, battery(ServedModel(MODEL)), ran))
    assert r.passed and r.hostile.unexpected == ["n-huge"] and "n-huge" in r.warnings()[0]


@pytest.mark.parametrize(
    ("repeat", "why"),
    [
        ("Paris. The", "the two answers before the run were identical"),
        ("Paris! No", "the server already answered it differently"),
    ],
)
def test_a_changed_greedy_answer_is_a_warning_that_says_where_it_parted(repeat: str, why: str) -> None:
    r = _report(greedy=GreedyCheck("p", 4, "Paris. The", repeat, "Paris. A"))
    assert r.passed and not r.greedy.identical and r.greedy.common_prefix == len("Paris. ")
    (warning,) = r.warnings()
    assert "DIFFERENT after 7 of 10 characters" in warning and why in warning and warning in markdown(r)


# --- command line ----------------------------------------------------------------------------------


def test_a_hostile_timeout_past_the_drain_is_refused() -> None:
    with pytest.raises(SystemExit) as e:
        main(["--hostile-timeout", "100", "--drain-seconds", "50"])
    assert e.value.code == 2


def test_the_soak_refuses_a_remote_host_and_stops_without_a_server(tmp_path: Path) -> None:
    assert main(["--host", "http://10.255.255.1:30000", "--out", str(tmp_path / "remote")]) == 2
    with socket.socket() as s:  # a port that was just free: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["--host", f"http://127.0.0.1:{port}", "--out", str(tmp_path / "none")]) == 2
    assert not (tmp_path / "remote").exists() and not (tmp_path / "none").exists()


def test_the_battery_is_written_for_the_served_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 321}))
    with FakeOpenAI(FakeConfig(native=True, model_path=str(tmp_path))) as fake:
        assert served_model(fake.url, MODEL, None)[0] == ServedModel(MODEL, 321, CONTEXT)
        assert served_model(fake.url, MODEL, 77)[0] == ServedModel(MODEL, 77, CONTEXT)
    with FakeOpenAI(FakeConfig()) as fake:  # no /model_info: SmolLM2's vocabulary, and a note saying so
        model, notes = served_model(fake.url, MODEL, None)
    assert model.vocab_size == 49152 and "--vocab-size" in notes[0]


# --- short soaks against the fake server -------------------------------------------------------------


def _soak(fake: FakeOpenAI, out: Path, seconds: int, every: int) -> int:
    return main(
        [
            "--host",
            fake.url,
            "--users",
            "8",
            "--minutes",
            str(seconds / 60),
            "--hostile-every",
            str(every),
            "--max-new-tokens",
            str(TOKENS),
            "--health-interval",
            "1",
            "--drain-seconds",
            "30",
            "--hostile-timeout",
            "20",
            "--out",
            str(out),
        ]
    )


def _fake_refusing(status: int) -> FakeOpenAI:
    """A fake that answers the battery (all but the disconnecting stream, a valid request) with ``status``."""
    refuse = frozenset(c.body for c in battery(ServedModel(MODEL, context_len=CONTEXT)) if not c.disconnect)
    return FakeOpenAI(FakeConfig(refuse=refuse, refuse_status=status))


@pytest.mark.server
def test_a_soak_accounts_for_every_request(tmp_path: Path) -> None:
    with _fake_refusing(400) as fake:
        assert _soak(fake, tmp_path, seconds=15, every=5) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    normal, hostile, health = summary["normal"], summary["hostile"], summary["health"]
    assert summary["passed"] and summary["problems"] == []
    assert normal["failures"] == 0 and normal["requests"] > 100
    assert normal["output_tokens"] == normal["requests"] * TOKENS
    # Every 5th normal request was preceded by the next case of the battery, each case in turn.
    assert hostile["sent"] == normal["requests"] // 5
    sent = [c["outcomes"] for c in hostile["cases"]]
    assert max(sum(o.values()) for o in sent) - min(sum(o.values()) for o in sent) <= 1
    disconnects = hostile["outcomes"]["accepted"]
    assert hostile["outcomes"] == {"rejected": fake.refused, "accepted": disconnects}
    assert hostile["unexpected"] == [] and hostile["failed"] == []
    # What the fake served: the normal requests, the disconnecting streams, the greedy request 2 + 1 times.
    assert fake.served == normal["requests"] + disconnects + 3
    assert health["polls"] == fake.health_polls >= 10 and health["failed"] == 0
    assert summary["greedy"]["identical"] and summary["greedy"]["reproducible_before"]
    assert summary["warnings"] == []
    ttft, latency = normal["ttft"], normal["latency"]
    # The fake's 50 ms before the first token. TTFT's percentiles span the requests that streamed a
    # token, latency's every answered one: across the two, only the medians' order holds reliably.
    assert 50 <= ttft["p50_ms"] <= ttft["p90_ms"] <= ttft["p99_ms"]
    assert ttft["p50_ms"] <= latency["p50_ms"] <= latency["p90_ms"] <= latency["p99_ms"]
    md = (tmp_path / "soak.md").read_text()
    assert md.startswith("# Soak: 8 users for 0.25 min, 1 hostile request per 5 normal ones")
    assert f"--host {fake.url} --users 8" in md and "**PASSED**" in md


@pytest.mark.server
def test_a_hostile_request_answered_with_a_500_fails_the_soak(tmp_path: Path) -> None:
    with _fake_refusing(500) as fake:
        assert _soak(fake, tmp_path, seconds=4, every=2) == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert not summary["passed"] and summary["normal"]["failures"] == 0
    assert summary["hostile"]["outcomes"].get("server_error") == fake.refused > 0
    assert len(summary["hostile"]["failed"]) == fake.refused
    (problem,) = summary["problems"]
    assert problem.startswith(f"{fake.refused:,} hostile requests got a 5xx or no answer")
