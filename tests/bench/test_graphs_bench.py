"""`echo-bench graphs` end to end on the CPU (the graph stages run eagerly there): every policy's
row is printed and every step's layout equals the eager one."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from sglang_echo.bench.graphs import main
from sglang_echo.bench.scheduler import bench_cases


def test_graphs_bench_runs_every_policy_without_differences(capsys):
    main(["--batch", "4", "--steps", "2", "--warmup", "1", "--vocab", "500", "--device", "cpu"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if re.search(r"\d+/3$", line)]
    assert len(rows) == len(bench_cases(4)), out
    assert all(line.endswith(" 0/3") for line in rows), out  # steps whose layouts differ from eager


def test_policies_filter_and_json(capsys, tmp_path):
    main(
        [
            "--batch",
            "4",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--vocab",
            "500",
            "--device",
            "cpu",
            "--policies",
            "static-tree",
            "--out",
            str(tmp_path / "graphs"),
        ]
    )
    rows = [
        line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("static-tree-") or line.startswith("echo")
    ]
    assert [r.split()[0] for r in rows] == ["static-tree-3x3x5", "static-tree-8x10x60"]
    raw = json.loads((tmp_path / "graphs.json").read_text())
    assert raw["command"].startswith("echo-bench graphs --batch 4") and raw["machine"]["cores"]
    assert [r["label"] for r in raw["rows"]] == ["static-tree-3x3x5", "static-tree-8x10x60"]
    assert all(r["differ"] == 0 and set(r["ms"]) == {"eager", "graphs", "all depths"} for r in raw["rows"])


def test_kernels_mode_dry_run_on_cpu():
    """``--kernels`` on the CPU: the ECHO family only, the Triton kernels under the interpreter
    (a subprocess, so this process's Triton stays compiled-mode), layouts equal to eager."""
    cmd = [
        sys.executable,
        "-m",
        "sglang_echo.bench.cli",
        "graphs",
        "--batch",
        "6",
        "--steps",
        "2",
        "--warmup",
        "0",
        "--vocab",
        "500",
        "--device",
        "cpu",
        "--kernels",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True).stdout
    rows = [line for line in out.splitlines() if re.search(r"\d+/2$", line)]
    assert [r.split()[0] for r in rows] == ["echo", "echo", "dense-gating"], out
    assert "kernels" in out and all(line.endswith(" 0/2") for line in rows), out
