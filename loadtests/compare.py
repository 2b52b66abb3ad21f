"""Compare sweeps of several servers (one per spec mode): a Markdown table and one PNG.

    python -m loadtests.compare out/loadtest/none out/loadtest/echo out/loadtest/eagle3 \
        --out out/loadtest/compare

Each argument is a sweep folder written by ``run.py``; its name labels it. Ratios are against the
first folder (put the no-speculation server first). Only levels every sweep ran are compared.
``run.py`` with several ``--host`` writes its own comparison (:func:`passes_markdown`, the
ratio of each pass and their median) from the servers it swept side by side.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .plot import _users_axis  # noqa: E402
from .summary import SUMMARY_CSV  # noqa: E402

COLUMNS = ("tokens_per_s", "tpot_p50_ms", "ttft_p50_ms", "latency_p50_ms", "failures", "requests")


def read_sweep(folder: Path) -> dict[int, dict[str, float | None]]:
    """``users -> {column: value}`` from a sweep's ``summary.csv`` (empty cells are None)."""
    path = folder / SUMMARY_CSV
    if not path.exists():
        raise FileNotFoundError(f"{folder}: no {SUMMARY_CSV} (not a finished sweep)")
    with open(path, newline="", encoding="utf-8") as fh:
        return {
            int(row["users"]): {c: float(row[c]) if row[c] else None for c in COLUMNS} for row in csv.DictReader(fh)
        }


def markdown(sweeps: dict[str, dict[int, dict]], users: list[int]) -> str:
    names = list(sweeps)
    base = names[0]
    head = ["users"] + [f"{n} tok/s" for n in names] + [f"{n} / {base}" for n in names[1:]]
    head += [f"{n} TPOT p50 ms" for n in names] + [f"{n} failed" for n in names]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for u in users:
        tps = [sweeps[n][u]["tokens_per_s"] for n in names]
        cells = [str(u)] + [f"{t:.1f}" for t in tps]
        cells += [f"{t / tps[0]:.2f}x" if tps[0] else "-" for t in tps[1:]]
        cells += [_num(sweeps[n][u]["tpot_p50_ms"]) for n in names]
        cells += [f"{int(sweeps[n][u]['failures'])}/{int(sweeps[n][u]['requests'])}" for n in names]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


Rows = dict[int, dict[str, float | None]]  # users -> column -> value, as read_sweep returns


def passes_markdown(passes: Sequence[dict[str, Rows]], users: list[int]) -> str:
    """Tokens/s of each server (median over passes) and, for every server after the first, its
    ratio to the first in each pass (servers of a pass ran each level back to back), the
    median ratio and the lowest."""
    names = list(passes[0])
    base = names[0]
    head = ["users"] + [f"{n} tok/s" for n in names]
    for n in names[1:]:
        head += [f"{n} / {base} per pass", "median", "min"]
    head += [f"{n} failed" for n in names]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for u in users:
        tps = {n: [p[n][u]["tokens_per_s"] or 0.0 for p in passes] for n in names}
        cells = [str(u)] + [f"{statistics.median(tps[n]):.1f}" for n in names]
        for n in names[1:]:
            ratios = [t / b for t, b in zip(tps[n], tps[base]) if b]
            cells += [
                " / ".join(f"{r:.2f}x" for r in ratios) or "-",
                f"{statistics.median(ratios):.2f}x" if ratios else "-",
                f"{min(ratios):.2f}x" if ratios else "-",
            ]
        cells += [
            f"{sum(int(p[n][u]['failures'] or 0) for p in passes)}/{sum(int(p[n][u]['requests'] or 0) for p in passes)}"
            for n in names
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def median_rows(passes: Sequence[dict[str, Rows]]) -> dict[str, Rows]:
    """Each server's columns, median over passes (what :func:`plot` draws for several passes)."""

    def med(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return statistics.median(present) if present else None

    return {n: {u: {c: med([p[n][u][c] for p in passes]) for c in COLUMNS} for u in passes[0][n]} for n in passes[0]}


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def plot(sweeps: dict[str, dict[int, dict]], users: list[int], path: Path, title: str = "") -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5), constrained_layout=True)
    panels = (
        ("tokens_per_s", "output tokens/s"),
        ("tpot_p50_ms", "time per output token p50 (ms)"),
        ("ttft_p50_ms", "time to first token p50 (ms)"),
    )
    for ax, (column, title) in zip(axes, panels):
        for name, rows in sweeps.items():
            pts = [(u, rows[u][column]) for u in users if rows[u][column] is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=name)
        ax.set_title(title)
        _users_axis(ax, users)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweeps", nargs="+", type=Path, help="sweep folders; the first is the baseline")
    p.add_argument("--out", type=Path, required=True, help="folder for compare.md and compare.png")
    args = p.parse_args(argv)
    try:
        sweeps = {folder.name: read_sweep(folder) for folder in args.sweeps}
    except (FileNotFoundError, KeyError, ValueError) as exc:
        print(f"loadtests.compare: {exc}", file=sys.stderr)
        return 2
    users = sorted(set.intersection(*(set(rows) for rows in sweeps.values())))
    if not users:
        print("loadtests.compare: the sweeps share no concurrency level", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    table = markdown(sweeps, users)
    (args.out / "compare.md").write_text(table, encoding="utf-8")
    png = plot(sweeps, users, args.out / "compare.png")
    print(table + f"\nwrote {args.out / 'compare.md'}, {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
