"""``echo-bench serve --interleave``: every server is up before the first level, each on its own
port, and each level of each pass runs every config back to back, in the pass's alternating order.
Every server's process starts from the main thread and only the waits for their health run in
worker threads: a process started by a worker thread gets SIGTERM when that thread ends
(``serve.server.die_with_parent``), which killed every interleaved server right after its
warm-up. The warm-ups then run one server at a time (together they share a CPU host's cores)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from sglang_echo.bench import serve
from sglang_echo.bench.load import Level
from sglang_echo.bench.serve_run import Run


class _FakeServer:
    """What ``_started_runs`` uses of :class:`~sglang_echo.bench.serve_endpoint.StartedServer`."""

    log: list[tuple] = []
    fail_launch: str | None = None

    def __init__(self, bench, name: str, port: int) -> None:
        self.name, self.port, self.srv = name, port, None

    def launch(self) -> None:
        if self.name == self.fail_launch:
            raise OSError(f"port {self.port} is already in use")
        self.srv = SimpleNamespace(stop=lambda: self.log.append(("stop", self.name)))
        self.log.append(("launch", self.name, self.port, threading.current_thread().name))

    def __enter__(self):
        assert self.srv is not None, "entered before launch"
        self.log.append(("enter", self.name))
        return SimpleNamespace(name=self.name)

    def __exit__(self, *exc) -> None:
        self.log.append(("exit", self.name))


def _measure(bench, ep, level, rep):
    _FakeServer.log.append((ep.name, level.concurrency, rep))
    return Run(ep.name, level.concurrency, level.concurrency, 1.0, level.concurrency, 0, None, repeat=rep)


@pytest.fixture
def bench(monkeypatch):
    _FakeServer.log, _FakeServer.fail_launch = [], None
    monkeypatch.setattr(serve, "StartedServer", _FakeServer)
    monkeypatch.setattr(serve, "measure", _measure)
    monkeypatch.setattr(serve, "warm_up", lambda bench, ep: _FakeServer.log.append(("warm", ep.name)))
    args = SimpleNamespace(interleave=True, config_names=["none", "echo"], port=30400, repeats=2)
    return SimpleNamespace(args=args, levels=[Level(8), Level(32)])


def test_servers_launch_on_the_main_thread_then_each_level_runs_config_after_config(bench):
    runs = serve._started_runs(bench)
    log = _FakeServer.log
    assert log[:2] == [("launch", "none", 30400, "MainThread"), ("launch", "echo", 30410, "MainThread")]
    assert sorted(log[2:4]) == [("enter", "echo"), ("enter", "none")]  # health waits, side by side
    assert log[4:] == [
        ("warm", "none"),
        ("warm", "echo"),
        ("none", 8, 0),
        ("echo", 8, 0),
        ("none", 32, 0),
        ("echo", 32, 0),
        ("echo", 8, 1),
        ("none", 8, 1),
        ("echo", 32, 1),
        ("none", 32, 1),
        ("exit", "echo"),
        ("exit", "none"),
    ]
    assert [(r.config, r.concurrency, r.repeat) for r in runs] == [e for e in log if len(e) == 3]


def test_a_failed_launch_stops_the_servers_already_launched(bench):
    _FakeServer.fail_launch = "echo"
    with pytest.raises(OSError, match="already in use"):
        serve._started_runs(bench)
    assert ("stop", "none") in _FakeServer.log
    assert not any(e[0] == "enter" for e in _FakeServer.log)
