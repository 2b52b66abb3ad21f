"""`echo-bench figures` on canned serve.json files (with and without per-request u)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from sglang_echo.bench import figures

from .test_serve_report import _report

pytest.importorskip("matplotlib")
DATA = Path(__file__).resolve().parent / "data"
PNG = b"\x89PNG\r\n\x1a\n"


def _is_png(p: Path) -> bool:
    return p.read_bytes()[:8] == PNG and p.stat().st_size > 5000


def test_all_figures_from_a_full_report(tmp_path):
    data = {"command": "echo-bench serve ...", **asdict(_report())}
    written = figures.render(data, tmp_path)
    assert [p.name for p in written] == ["throughput.png", "utilisation.png", "budget.png"]
    assert all(_is_png(p) for p in written)


def test_old_results_without_u_still_get_throughput(tmp_path):
    src = DATA / "serve-old-format.json"  # an early serve.json: no per-request records
    data = json.loads(src.read_text())
    assert "per_request" not in data["runs"][0]
    written = figures.render(data, tmp_path)
    assert [p.name for p in written] == ["throughput.png"] and _is_png(written[0])


def test_cli_redraws_next_to_serve_json(tmp_path, capsys):
    from sglang_echo.bench.cli import main

    (tmp_path / "serve.json").write_text(json.dumps({"command": "x", **asdict(_report())}))
    main(["figures", str(tmp_path), "--markdown"])
    out = capsys.readouterr().out
    assert "throughput.png" in out and "serve.md" in out
    assert _is_png(tmp_path / "utilisation.png")
    assert "Draft utilisation per request" in (tmp_path / "serve.md").read_text()


def test_several_passes_draw_each_speedup_with_its_interval(tmp_path, monkeypatch):
    """A run with ``--repeats 2`` (the c = 1-256 sweep's runs, trimmed to what the figure reads): the
    speedup panel draws every config's geometric mean over the passes with its 95% interval, one per
    (config, level)."""
    drawn = []
    real = figures.ratio_interval
    monkeypatch.setattr(figures, "ratio_interval", lambda rs: drawn.append(len(rs)) or real(rs))
    data = json.loads((DATA / "serve-two-passes.json").read_text())
    written = figures.render(data, tmp_path)
    assert _is_png(tmp_path / "throughput.png") and tmp_path / "throughput.png" in written
    assert drawn == [2] * 12  # eagle3 and echo-cost at c = 1, 8, 32, 64, 128, 256


def test_request_rate_runs_plot_against_the_rate_with_inf_last(tmp_path, monkeypatch):
    """Open-loop levels (--request-rate): the x axis is the rate, ``inf`` (a string in serve.json)
    drawn after the largest finite rate; speedups pair runs of the same rate."""
    import math

    from sglang_echo.bench.requests_log import json_ready
    from sglang_echo.bench.serve import Report, Run, markdown, report_from_json

    runs = [
        Run(name, 32, 16, 2.0, tokens, 0, None, request_rate=rate)
        for rate in (1.0, 4.0, math.inf)
        for name, tokens in (("none", 100), ("echo", 120))
    ]
    report = Report({"platform": "t", "cpus": 2}, {}, runs)
    data = json.loads(json.dumps(json_ready({"command": "x", **asdict(report)})))
    ticks = []
    real = figures._log2_axis
    monkeypatch.setattr(figures, "_log2_axis", lambda ax, levels, rs: ticks.append(levels) or real(ax, levels, rs))
    written = figures.render(data, tmp_path)
    assert written == [tmp_path / "throughput.png"] and _is_png(written[0])
    assert ticks[0] == [1.0, 4.0, math.inf] and figures._x(math.inf, ticks[0]) == 8.0
    md = markdown(report_from_json(data))
    assert "| config | request rate (req/s) | tokens/s |" in md and "| echo | inf | 60.00 | 1.20x |" in md


def test_the_title_names_the_model_of_base_url_servers():
    """``--base-url`` runs record the model per target and no dtype: the title names the shared
    model instead of a question mark, and a started run's title keeps its dtype."""
    target = {"url": "http://127.0.0.1:1", "model": "/cache/models/SmolLM2-135M-Instruct-float32"}
    data = {"settings": {"targets": {"none": target, "echo": target}, "max_new": 64}, "machine": {"cpus": 2}}
    assert figures._title(data) == "SmolLM2-135M-Instruct-float32, max_new 64, 2 CPUs"
    started = {"settings": {"model": "/m/SmolLM2", "dtype": "float32", "max_new": 64}, "machine": {"cpus": 2}}
    assert figures._title(started) == "SmolLM2 (float32), max_new 64, 2 CPUs"
