"""Server fixtures: each real sglang server starts once per module (or session) and is always
killed. Ports come from 32000-32099 (pairs: HTTP + sglang's rendezvous port)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_echo.serve.flags import ServerOptions, SpecOptions
from sglang_echo.serve.server import SGLangServer, find_free_port_pair

# float32 on CPU: spec and no-spec runs batch tokens differently (verify processes k+1 tokens
# per request at once), and bf16 reductions make greedy near-ties flip between such shapes,
# which is a numerics artefact rather than a speculative-decoding bug. Override to check bf16.
SERVER_DTYPE = os.environ.get("SGLANG_ECHO_TEST_DTYPE", "float32")
STARTUP_TIMEOUT = float(os.environ.get("SGLANG_ECHO_TEST_STARTUP_TIMEOUT", "600"))
LOG_DIR = Path(os.environ.get("SGLANG_ECHO_TEST_LOG_DIR", "/tmp/sglang-echo-test-logs"))


def start_server(
    model_path: Path,
    *,
    spec: str = "none",
    draft_path: Path | None = None,
    spec_options: SpecOptions = SpecOptions(),
    enable_metrics: bool = False,
    extra_args: tuple[str, ...] = (),
) -> SGLangServer:
    """Start (and wait for) a server; the caller must stop() it (fixtures do, in finally)."""
    port = find_free_port_pair(32000, 32099)
    opts = ServerOptions(
        model_path=model_path,
        port=port,
        spec=spec,
        draft_path=draft_path,
        spec_options=spec_options,
        dtype=SERVER_DTYPE,
        enable_metrics=enable_metrics,
        extra_args=extra_args,
    )
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"{spec}-{port}-{time.strftime('%H%M%S')}.log"
    srv = SGLangServer(opts, log_path=log, startup_timeout=STARTUP_TIMEOUT)
    srv.__enter__()  # starts, waits for /health; kills everything itself if that fails
    print(f"\n[server] {spec} on :{port} healthy after {srv.startup_seconds:.1f}s (log {log})")
    return srv


class LazyServer:
    """A server started on first use and stoppable early, restarted if needed again.

    Why: an sglang server is expensive to start, so the API tests and the losslessness
    reference share one; but a live server also takes CPU from the next one on a 2-core
    box, so the losslessness tests release it once the reference outputs are collected.
    """

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs
        self._srv: SGLangServer | None = None

    def get(self) -> SGLangServer:
        if self._srv is None or not self._srv.alive():
            self.release()
            self._srv = start_server(**self.kwargs)
        return self._srv

    def release(self) -> None:
        if self._srv is not None:
            self._srv.stop()
            self._srv = None


@pytest.fixture(scope="session")
def baseline(smollm2_dir: Path) -> Iterator[LazyServer]:
    """No-speculation SmolLM2 server with metrics; shared by the API and losslessness tests."""
    lazy = LazyServer(model_path=smollm2_dir, enable_metrics=True)
    try:
        yield lazy
    finally:
        lazy.release()
