"""Shared fixtures (keep small): the prepared SmolLM2 and how every test suite starts a server."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

# Without CUDA every Triton kernel in the tests runs under Triton's interpreter. Triton reads the
# variable when a kernel is decorated, so it is set before any test module is collected: a module
# that imports transformers at collection time also imports triton.language, and the interpreter
# needs Triton's own library functions decorated in interpreter mode too (tests/kernels/conftest.py).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from sglang_echo.serve.flags import ServerOptions
from sglang_echo.serve.server import SGLangServer, find_free_port_pair

STARTUP_TIMEOUT = float(os.environ.get("SGLANG_ECHO_TEST_STARTUP_TIMEOUT", "600"))
LOG_DIR = Path(os.environ.get("SGLANG_ECHO_TEST_LOG_DIR", "/tmp/sglang-echo-test-logs"))
# Each suite's server ports (pairs: HTTP + sglang's rendezvous port), all below Linux's ephemeral
# ports, which find_free_port_pair refuses (see sglang_echo.serve.server).
SERVER_PORTS = (32000, 32099)
INTEGRATION_PORTS = (32100, 32199)
LOADTEST_PORTS = (32200, 32299)
REPLAY_PORTS = (32300, 32399)
# Suites of tiny random models: they run ~30x faster on one thread than on a busy multi-core box.
ONE_THREAD_SUITES = ("drafters", "training", "eval", "replay")


def pytest_configure(config):
    """Under pytest-xdist (``make test`` runs three) the workers share the cores: each
    worker, and every server it starts (they inherit ``OMP_NUM_THREADS``), gets an equal share of
    compute threads instead of all of them (oversubscribed OpenMP threads spin against each other)."""
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    if workers > 1:
        share = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(share)
        torch.set_num_threads(share)


@pytest.hookimpl(trylast=True)  # after the suites' own hooks have marked what they skip
def pytest_collection_modifyitems(config, items):
    """Files that start servers run first, those with the most server tests first.

    ``make test`` hands pytest-xdist whole files in collection order (``--no-loadscope-reorder``;
    xdist's own order, most tests first, left the few-test server files, minutes each, to the end
    of the run, where one worker finished them while the others idled). Each file keeps its place
    among equals and its tests their order."""

    def server_tests(item) -> bool:
        return item.get_closest_marker("server") is not None and item.get_closest_marker("skip") is None

    per_file = Counter(item.path for item in items if server_tests(item))
    items.sort(key=lambda item: -per_file[item.path])


def worker_ports(ports: tuple[int, int]) -> tuple[int, int]:
    """This xdist worker's share of a suite's port range, so that two workers starting servers
    at once never pick the same free pair (the whole range without xdist)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker is None or count <= 1:
        return ports
    lo, hi = ports
    width = (hi - lo) // count // 2 * 2  # even: pairs start on even ports
    i = int(worker.removeprefix("gw"))
    return lo + i * width, lo + (i + 1) * width


@pytest.fixture(autouse=True, scope="module")
def _one_thread(request):
    if request.path.parent.name not in ONE_THREAD_SUITES:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def launch_test_server(ports: tuple[int, int], log_tag: str, **options) -> SGLangServer:
    """Start a server on a free port pair in ``ports`` and wait for /health; the caller stops it.

    ``options`` are :class:`ServerOptions` fields; the log goes to ``LOG_DIR``.
    """
    port = find_free_port_pair(*worker_ports(ports))
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"{log_tag}-{port}-{time.strftime('%H%M%S')}.log"
    srv = SGLangServer(ServerOptions(port=port, **options), log_path=log, startup_timeout=STARTUP_TIMEOUT)
    srv.__enter__()  # starts, waits for /health; kills everything itself if that fails
    print(f"\n[server] {log_tag} on :{port} healthy after {srv.startup_seconds:.1f}s (log {log})")
    return srv


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The prepared SmolLM2-135M-Instruct checkpoint (bf16), built once and cached on disk."""
    from sglang_echo.models.prepare import prepare

    return prepare().path
