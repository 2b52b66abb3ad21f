"""Server fixtures: each real sglang server starts once per module (or session) and is always
killed. Ports come from ``SERVER_PORTS`` (tests/conftest.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_echo.serve.flags import SpecOptions
from sglang_echo.serve.server import SGLangServer

from ..conftest import SERVER_PORTS, launch_test_server

# float32 on CPU: spec and no-spec runs batch tokens differently (verify processes k+1 tokens
# per request at once), and bf16 reductions make greedy near-ties flip between such shapes,
# which is a numerics artefact rather than a speculative-decoding bug. Override to check bf16.
SERVER_DTYPE = os.environ.get("SGLANG_ECHO_TEST_DTYPE", "float32")


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
    return launch_test_server(
        SERVER_PORTS,
        spec,
        model_path=model_path,
        spec=spec,
        draft_path=draft_path,
        spec_options=spec_options,
        dtype=SERVER_DTYPE,
        enable_metrics=enable_metrics,
        extra_args=extra_args,
    )


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
