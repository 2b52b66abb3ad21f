"""loadtests.compare: ratios against the first sweep, only shared levels, clear refusals."""

from __future__ import annotations

from pathlib import Path

from loadtests.compare import main
from loadtests.summary import LevelResult, write_csvs


def _sweep(folder: Path, tokens_per_s: dict[int, float], failures: int = 0) -> Path:
    folder.mkdir()
    rows = [
        LevelResult(
            users=u,
            stopped_by="time",
            requests=10,
            failures=failures,
            duration_s=10.0,
            req_per_s=1.0,
            output_tokens=int(t * 10),
            tokens_per_s=t,
            latency_p50_ms=100.0,
            latency_p95_ms=150.0,
            ttft_p50_ms=20.0,
            ttft_p95_ms=30.0,
            tpot_p50_ms=1000.0 / t,
            tpot_p95_ms=None,
            client_cpu_warning=False,
        )
        for u, t in tokens_per_s.items()
    ]
    write_csvs(rows, folder)
    return folder


def test_table_and_plot(tmp_path: Path, capsys) -> None:
    none = _sweep(tmp_path / "none", {8: 50.0, 16: 80.0, 32: 100.0})
    echo = _sweep(tmp_path / "echo", {8: 40.0, 16: 80.0}, failures=1)  # no 32-user level
    out = tmp_path / "cmp"
    assert main([str(none), str(echo), "--out", str(out)]) == 0
    lines = (out / "compare.md").read_text().splitlines()
    assert lines[0].startswith("| users | none tok/s | echo tok/s | echo / none |")
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| 8", "| 16"]  # shared levels only
    assert "| 0.80x |" in lines[2] and "| 1.00x |" in lines[3]
    assert "1/10" in lines[2]  # failures shown per sweep
    assert (out / "compare.png").read_bytes()[:4] == b"\x89PNG"


def test_unfinished_sweep_is_refused(tmp_path: Path, capsys) -> None:
    (tmp_path / "half").mkdir()
    assert main([str(tmp_path / "half"), "--out", str(tmp_path / "cmp")]) == 2
    assert "no summary.csv" in capsys.readouterr().err
