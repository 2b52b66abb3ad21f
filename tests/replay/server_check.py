"""A SmolLM2 trace, then ``echo-replay validate-server`` against it: what the server tests of the
replay (tests/replay) and of simulated acceptance (tests/integration) share."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from ..conftest import worker_ports


def record_then_validate(
    tmp_path: Path, ports: tuple[int, int], record: Sequence[str], validate: Sequence[str]
) -> list[dict]:
    """Record one chat and one HumanEval prompt on SmolLM2 (float32) with ``record``'s options, then
    serve both prompts (one server per policy, ``validate``'s options) and return the rows;
    ``validate-server`` exits 1 on any mismatch, after printing it and writing the rows."""
    from sglang_echo.models.prepare import prepare
    from sglang_echo.replay.cli import main
    from sglang_echo.serve.server import find_free_port_pair

    model = prepare(dtype="float32").path
    stem, out = tmp_path / "trace", tmp_path / "server.json"
    main(
        [
            "record",
            "--model",
            str(model),
            "--prompts",
            "chat,humaneval",
            "--per-set",
            "1",
            "--batch",
            "2",
            "--out",
            str(stem),
            *record,
        ]
    )
    port = find_free_port_pair(*worker_ports(ports))
    main(
        [
            "validate-server",
            "--trace",
            str(stem),
            "--num-prompts",
            "2",
            "--port",
            str(port),
            "--out",
            str(out),
            *validate,
        ]
    )
    return json.loads(out.read_text())["rows"]
