"""``echo-bench serve --interleave`` starts every server's process from the main thread and only
waits for them (health, warm-up) in worker threads: a process started by a worker thread gets
SIGTERM when that thread ends (``serve.server.die_with_parent``), which killed every interleaved
server right after its warm-up."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from sglang_echo.bench import serve


class _FakeServer:
    """What ``_started_runs`` uses of :class:`~sglang_echo.bench.serve_endpoint.StartedServer`."""

    log: list[tuple[str, str, str]] = []
    fail_launch: str | None = None

    def __init__(self, bench, name: str, port: int) -> None:
        self.name, self.port, self.srv = name, port, None

    def launch(self) -> None:
        if self.name == self.fail_launch:
            raise OSError(f"port {self.port} is already in use")
        self.srv = SimpleNamespace(stop=lambda: self.log.append(("stop", self.name, "")))
        self.log.append(("launch", self.name, threading.current_thread().name))

    def __enter__(self):
        assert self.srv is not None, "entered before launch"
        self.log.append(("enter", self.name, threading.current_thread().name))
        return self.name

    def __exit__(self, *exc) -> None:
        self.log.append(("exit", self.name, ""))


@pytest.fixture
def bench(monkeypatch):
    _FakeServer.log, _FakeServer.fail_launch = [], None
    monkeypatch.setattr(serve, "StartedServer", _FakeServer)
    monkeypatch.setattr(serve, "measure", lambda bench, ep, level, rep: (ep, level, rep))
    args = SimpleNamespace(interleave=True, config_names=["none", "echo", "eagle3"], port=30400, repeats=1)
    return SimpleNamespace(args=args, levels=[1])


def test_every_process_starts_on_the_main_thread_before_any_wait(bench):
    runs = serve._started_runs(bench)
    launches = [e for e in _FakeServer.log if e[0] == "launch"]
    assert [(n, t) for _, n, t in launches] == [(n, "MainThread") for n in ("none", "echo", "eagle3")]
    first_enter = next(i for i, e in enumerate(_FakeServer.log) if e[0] == "enter")
    assert first_enter == 3  # every launch came first
    assert sorted(r[0] for r in runs) == ["eagle3", "echo", "none"]
    assert {e[1] for e in _FakeServer.log if e[0] == "exit"} == {"none", "echo", "eagle3"}


def test_a_failed_launch_stops_the_servers_already_launched(bench):
    _FakeServer.fail_launch = "echo"
    with pytest.raises(OSError, match="already in use"):
        serve._started_runs(bench)
    assert ("stop", "none", "") in _FakeServer.log
    assert not any(e[0] == "enter" for e in _FakeServer.log)
