"""`SGLangServer`: run a real sglang server as a subprocess for tests and benchmarks.

    with SGLangServer(ServerOptions(model_path=..., port=32010)) as srv:
        requests.post(srv.url("/v1/completions"), json=...)

Starts the server in its own process group (sglang forks scheduler/detokenizer children),
waits for GET /health, sends all output to a log file, and on exit always kills the whole
group -- also when start-up fails or the test process is interrupted. On Linux the server also
dies with the process that started it, even one killed by SIGTERM or SIGKILL, where neither
``__exit__`` nor ``atexit`` runs (:func:`die_with_parent`).
"""

from __future__ import annotations

import atexit
import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Callable

from sglang_echo.serve.flags import LaunchCommand, ServerOptions, build_command

_LIVE: set["SGLangServer"] = set()


class ServerStartError(RuntimeError):
    pass


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


# Linux hands out client ports from 32768 up (net.ipv4.ip_local_port_range). Polling a port in
# that range before the server listens can connect the socket to itself (TCP simultaneous open):
# the health check then reads back its own request. Servers we start listen below it.
EPHEMERAL_PORTS_START = 32768


def find_free_port_pair(lo: int = 32000, hi: int = 32099, host: str = "127.0.0.1") -> int:
    """Lowest even port p in [lo, hi) with p and p+1 free (HTTP + sglang's rendezvous port)."""
    if hi > EPHEMERAL_PORTS_START:
        raise ValueError(f"port range {lo}-{hi} reaches the ephemeral ports (>= {EPHEMERAL_PORTS_START})")
    for p in range(lo + (lo % 2), hi, 2):
        if port_is_free(p, host) and port_is_free(p + 1, host):
            return p
    raise ServerStartError(f"no free port pair in {lo}-{hi}")


# Runs in the child before sglang: the kernel sends it SIGTERM when its parent dies
# (PR_SET_PDEATHSIG = 1, kept across exec); sglang's launcher stops its scheduler and detokenizer
# on SIGTERM, and they die with it anyway. A parent that died before the prctl is caught by getppid.
_DIE_WITH_PARENT = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""


def die_with_parent(argv: list[str]) -> list[str]:
    """``argv`` run so that it gets SIGTERM when this process dies (Linux; elsewhere unchanged).

    The signal follows the *thread* that starts the child: start servers from a thread that
    outlives them (every caller here starts them from the main thread)."""
    if sys.platform != "linux":
        return argv
    return [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]


class SGLangServer:
    def __init__(
        self,
        opts: ServerOptions,
        *,
        log_path: Path | None = None,
        startup_timeout: float = 600.0,
        health_path: str = "/health",
    ) -> None:
        self.opts = opts
        self.command: LaunchCommand = build_command(opts)
        if log_path is None:
            log_dir = Path(tempfile.gettempdir()) / "sglang-echo-logs"
            log_dir.mkdir(parents=True, exist_ok=True)
            log_path = log_dir / f"server-{opts.spec}-{opts.port}-{int(time.time())}.log"
        self.log_path = Path(log_path)
        self.startup_timeout = startup_timeout
        self.health_path = health_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float | None = None

    # -- addresses ---------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return self.opts.base_url

    def url(self, path: str) -> str:
        return self.base_url + path

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self.proc is not None:
            raise RuntimeError("already started")
        for p in (self.opts.port, self.opts.port + 1):
            if not port_is_free(p, self.opts.host):
                raise ServerStartError(f"port {p} on {self.opts.host} is already in use")
        env = {**os.environ, **self.command.env}
        log = open(self.log_path, "ab")
        log.write(("$ " + " ".join(self.command.argv) + "\n").encode())
        log.write(("env+ " + repr(self.command.env) + "\n").encode())
        log.flush()
        try:
            # start_new_session: own process group, so stop() can kill sglang's children too.
            self.proc = subprocess.Popen(
                die_with_parent(self.command.argv),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()  # the child holds its own descriptor
        _LIVE.add(self)

    def healthy(self, timeout: float = 5.0) -> bool:
        """True once GET health_path answers 200; anything else, a reply that is not HTTP included, is False."""
        try:
            with urllib.request.urlopen(self.url(self.health_path), timeout=timeout) as r:
                return r.status == 200
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
            return False

    def wait_healthy(self) -> float:
        assert self.proc is not None
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.startup_timeout:
            rc = self.proc.poll()
            if rc is not None:
                raise ServerStartError(
                    f"sglang exited with code {rc} during start-up; log: {self.log_path}\n" + self.log_tail()
                )
            if self.healthy():
                self.startup_seconds = time.monotonic() - t0
                return self.startup_seconds
            time.sleep(0.5)
        raise ServerStartError(
            f"sglang not healthy after {self.startup_timeout:.0f}s; log: {self.log_path}\n" + self.log_tail()
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cpu_seconds(self) -> float:
        """User + system CPU seconds the server has used so far: its process and every live
        descendant (sglang's scheduler and detokenizer). A difference of two readings is the work
        a load cost the server, whatever else ran on the machine meanwhile."""
        import psutil

        if self.proc is None:
            return 0.0
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0.0
        total = 0.0
        for proc in procs:
            try:
                t = proc.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total

    def stop(self, grace: float = 10.0) -> None:
        """Terminate the whole process group: SIGTERM, then SIGKILL once sglang's children have
        exited, or after `grace` seconds; return once the server's ports are free again (at most
        `grace` seconds more: a port still bound then is reported by the next start() on it).

        Not waiting for the launcher itself: when a child dies of the SIGTERM, sglang's launcher
        takes it for a crash and sleeps 5 s "to let GPU activity settle" before exiting, which is
        most of a stop (and ~35 server stops per test run). Whoever calls stop() has its answers."""
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        if proc is None:
            return
        pgid = proc.pid  # == pgid thanks to start_new_session
        children = _descendants(proc.pid)
        _signal_group(pgid, signal.SIGTERM)
        _wait_until(lambda: proc.poll() is not None or all(map(_exited, children)), grace)
        _signal_group(pgid, signal.SIGKILL)
        # Children that left the group (setsid) are still ours: kill them by pid.
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        # Done when the next server can take the ports: a killed process's sockets outlive it
        # briefly (seen under load: the scheduler's rendezvous port, port + 1, still bound).
        host, port = self.opts.host, self.opts.port
        _wait_until(
            lambda: all(map(_exited, children)) and port_is_free(port, host) and port_is_free(port + 1, host), grace
        )

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def __enter__(self) -> "SGLangServer":
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _wait_until(done: Callable[[], bool], seconds: float, poll: float = 0.05) -> bool:
    """Poll ``done`` until it holds (True) or ``seconds`` have passed (False)."""
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)
    return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _exited(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie its parent has not reaped yet included)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _descendants(pid: int) -> list[int]:
    try:
        import psutil

        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except Exception:
        return []


@atexit.register
def _kill_leftovers() -> None:
    # Last line of defence (e.g. KeyboardInterrupt between start() and the with-block).
    for srv in list(_LIVE):
        srv.stop(grace=2.0)
