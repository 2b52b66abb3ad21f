"""`echo-bench figures`: the plots of an `echo-bench serve` run, from its ``serve.json``.

* ``throughput.png``: tokens/s against concurrency (or request rate), one line per configuration, log2 x axis
  (ECHO Fig. 5's shape), and next to it the speedup over ``none`` at each level; configurations
  other than ``none``/``eagle3`` are labelled with their largest gain over ``eagle3`` (as Fig. 5
  prints under each column). With several passes (``--repeats``) each speedup is the geometric
  mean of the per-pass ratios with its 95% interval as an error bar.
* ``utilisation.png``: per-request draft utilisation u = MAT / depth (over the steps that
  drafted) as box plots per configuration at each concurrency (ECHO Fig. 4: box = 25th-75th
  percentile, whiskers 5th-95th, mean marked). Needs the per-request records
  (``per_request[*].u``); results written before they existed get no utilisation figure, the
  others are still drawn.
* ``budget.png`` (ECHO servers only): verified tokens per step against K_max, and the control
  plane's share of the step time against the 3% goal.

    echo-bench figures benchmarks/results/serve-smollm2-ragged          # or .../serve.json
    echo-bench figures DIR --markdown                                  # also rewrite serve.md

matplotlib is optional: without it nothing is drawn (and :func:`render` returns ``[]``).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from ..cli_args import CommandError, Parser, out_dir, run
from .serve_run import CONTROL_GOAL, report_from_json
from .serve_tables import markdown, ratio_interval, speedups


def load(path: str | Path) -> tuple[dict, Path]:
    """``serve.json`` (a file, or the folder holding it) and the folder the figures go to."""
    p = Path(path)
    if p.is_dir():
        p = p / "serve.json"
    return json.loads(p.read_text()), p.parent


def _runs(data: dict) -> list[dict]:
    """Each run with ``tokens_per_s`` (old files: computed from tokens and seconds) and ``level``: its
    request rate (open loops; ``"inf"`` in JSON) or its concurrency."""
    out = []
    for r in data.get("runs", []):
        r = dict(r)
        if "tokens_per_s" not in r:
            r["tokens_per_s"] = r["completion_tokens"] / r["seconds"] if r.get("seconds") else float("nan")
        rate = r.get("request_rate")
        r["level"] = r["concurrency"] if rate is None else float(rate)
        out.append(r)
    return out


def _x(level: float, levels: list[float]) -> float:
    """Where a level sits on the log2 axis: itself, or for an infinite rate twice the largest other."""
    finite = [v for v in levels if math.isfinite(v)]
    return level if math.isfinite(level) else 2.0 * max(finite, default=1.0)


def _pooled_rates(runs: list[dict]) -> dict[tuple[str, int], float]:
    """Tokens/s per (config, level), pooled over passes (``--repeats``): all tokens / all seconds."""
    tokens: dict[tuple[str, int], float] = {}
    seconds: dict[tuple[str, int], float] = {}
    for r in runs:
        key = (r["config"], r["level"])
        tokens[key] = tokens.get(key, 0.0) + r["completion_tokens"]
        seconds[key] = seconds.get(key, 0.0) + r["seconds"]
    return {k: tokens[k] / seconds[k] if seconds[k] else float("nan") for k in tokens}


def _configs(runs: list[dict]) -> list[str]:
    seen: list[str] = []
    for r in runs:
        if r["config"] not in seen:
            seen.append(r["config"])
    return seen


def _colors(plt, runs: list[dict]) -> dict[str, str]:
    """One colour per configuration, the same in every figure."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {name: cycle[i % len(cycle)] for i, name in enumerate(_configs(runs))}


def _title(data: dict) -> str:
    """Model, dtype, reply length and CPUs. Servers measured through ``--base-url`` carry their
    model per target and no dtype: the title names the model they share and leaves the dtype out."""
    s = data.get("settings", {})
    models = {t.get("model") for t in s.get("targets", {}).values()} - {None}
    model = Path(str(s.get("model") or (models.pop() if len(models) == 1 else "?"))).name
    dtype = f" ({s['dtype']})" if s.get("dtype") else ""
    m = data.get("machine", {})
    return f"{model}{dtype}, max_new {s.get('max_new', '?')}, {m.get('cpus', '?')} CPUs"


def _plt():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def render(data: dict, out: str | Path) -> list[Path]:
    """Write every figure ``data`` supports into ``out``; the paths written ([] without matplotlib)."""
    plt = _plt()
    if plt is None:
        return []
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = _runs(data)
    written = []
    for draw in (throughput, utilisation, budget):
        path = draw(plt, data, runs, out)
        if path is not None:
            written.append(path)
    return written


def _log2_axis(ax, levels: list[float], runs: list[dict]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks([_x(c, levels) for c in levels])
    ax.set_xticklabels([f"{c:g}" for c in levels])
    ax.minorticks_off()
    closed = all(r.get("request_rate") is None for r in runs)
    ax.set_xlabel("concurrency (clients = max batch size)" if closed else "request rate (req/s, Poisson arrivals)")
    ax.grid(True, alpha=0.3)


def throughput(plt, data: dict, runs: list[dict], out: Path) -> Path | None:
    if not runs:
        return None
    levels = sorted({r["level"] for r in runs})
    by = _pooled_rates(runs)
    configs = _configs(runs)
    color = _colors(plt, runs)
    per_pass = speedups(report_from_json(data).runs)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name in configs:
        cs = [c for c in levels if (name, c) in by]
        label = name
        gains = [by[name, c] / by["eagle3", c] - 1 for c in cs if ("eagle3", c) in by and by["eagle3", c] > 0]
        if name not in ("none", "eagle3") and gains:
            label += f" (max {100 * max(gains):+.1f}% vs eagle3)"
        ax.plot([_x(c, levels) for c in cs], [by[name, c] for c in cs], marker="o", label=label, color=color[name])
        passes = [(c, ratio_interval(per_pass[name, c])) for c in cs if len(per_pass.get((name, c), ())) > 1]
        base = [(c, by[name, c] / by["none", c]) for c in cs if ("none", c) in by and by["none", c] > 0]
        if passes:  # several passes: their geometric mean and its 95% interval
            mid, lo, hi = (np.array(v) for v in zip(*(iv for _, iv in passes)))
            ax2.errorbar(
                [_x(c, levels) for c, _ in passes],
                mid,
                yerr=[mid - lo, hi - mid],
                marker="o",
                capsize=3,
                label=name,
                color=color[name],
            )
        elif base and name != "none":
            ax2.plot([_x(c, levels) for c, _ in base], [s for _, s in base], marker="o", label=name, color=color[name])
    ax.set_ylabel("throughput (output tokens/s)")
    ax.set_title("Throughput vs load")
    _log2_axis(ax, levels, runs)
    ax.legend(fontsize=7)
    ax2.axhline(1.0, color="gray", ls="--", lw=1)
    ax2.set_ylabel("speedup vs none")
    several = any(len(v) > 1 for v in per_pass.values())
    ax2.set_title(
        "Speedup over no speculation" + (" (passes: geo mean, 95% interval)" if several else ""),
        fontsize=9 if several else None,
    )
    _log2_axis(ax2, levels, runs)
    if ax2.lines[1:]:
        ax2.legend(fontsize=7)
    fig.suptitle(_title(data), fontsize=9)
    fig.tight_layout()
    return _save(plt, fig, out / "throughput.png")


def _u_values(r: dict) -> list[float]:
    return [x["u"] for x in r.get("per_request") or [] if x.get("u") is not None and math.isfinite(x["u"])]


def utilisation(plt, data: dict, runs: list[dict], out: Path) -> Path | None:
    with_u = [r for r in runs if _u_values(r)]
    if not with_u:
        return None
    levels = sorted({r["level"] for r in with_u})
    configs = _configs(with_u)
    by = {(r["config"], r["level"]): _u_values(r) for r in with_u}
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(levels) * len(configs) + 1.5), 3.8))
    width = 0.8 / len(configs)
    colors = _colors(plt, runs)
    for j, name in enumerate(configs):
        pos, vals = [], []
        for i, c in enumerate(levels):
            if (name, c) in by:
                pos.append(i - 0.4 + width * (j + 0.5))
                vals.append(by[name, c])
        if not vals:
            continue
        color = colors[name]
        ax.boxplot(
            vals,
            positions=pos,
            widths=width * 0.85,
            whis=(5, 95),
            showfliers=False,
            showmeans=True,
            patch_artist=True,
            boxprops={"facecolor": color, "alpha": 0.45},
            medianprops={"color": "black"},
            meanprops={"marker": "^", "markerfacecolor": "white", "markeredgecolor": "black", "markersize": 4},
        )
        ax.plot([], [], color=color, lw=6, alpha=0.45, label=name)
    ax.set_xticks(range(len(levels)))
    closed = all(r.get("request_rate") is None for r in with_u)
    ax.set_xticklabels([f"c={c:g}" if closed else f"{c:g} req/s" for c in levels])
    ax.set_xlim(-0.5, len(levels) - 0.5)
    ax.set_ylabel("draft utilisation u = MAT / depth")
    ax.set_title("Per-request draft utilisation (box 25-75%, whiskers 5-95%, ^ mean)", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle(_title(data), fontsize=9)
    fig.tight_layout()
    return _save(plt, fig, out / "utilisation.png")


def budget(plt, data: dict, runs: list[dict], out: Path) -> Path | None:
    echo = [r for r in runs if r.get("echo")]
    if not echo:
        return None
    levels = sorted({r["level"] for r in echo})
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    color = _colors(plt, runs)
    k_max = None
    for name in _configs(echo):
        rs = [r for r in echo if r["config"] == name]
        pts = [(_x(r["level"], levels), r["echo"].get("verified_per_step")) for r in rs]
        pts = [(c, v) for c, v in pts if v is not None]
        if pts:
            ax.plot([c for c, _ in pts], [v for _, v in pts], marker="o", label=name, color=color[name])
        shares = [(_x(r["level"], levels), r["echo"].get("control_share")) for r in rs]
        shares = [(c, 100 * s) for c, s in shares if s is not None]
        if shares:
            ax2.plot([c for c, _ in shares], [s for _, s in shares], marker="o", label=name, color=color[name])
        k_max = k_max or next((r["echo"].get("k_max") for r in rs if r["echo"].get("k_max")), None)
    if k_max:
        ax.axhline(k_max, color="gray", ls="--", lw=1, label=f"K_max = {k_max:.0f}")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("verified tokens per step (sum K_i)")
    ax.set_title("Verification budget use")
    _log2_axis(ax, levels, echo)
    ax.legend(fontsize=7)
    ax2.axhline(100 * CONTROL_GOAL, color="tab:red", ls="--", lw=1, label=f"goal {100 * CONTROL_GOAL:.0f}%")
    ax2.set_ylabel("control plane, % of step time")
    ax2.set_title("Gating + scheduling + packing")
    ax2.set_ylim(bottom=0)
    _log2_axis(ax2, levels, echo)
    ax2.legend(fontsize=7)
    fig.suptitle(_title(data), fontsize=9)
    fig.tight_layout()
    return _save(plt, fig, out / "budget.png")


def _save(plt, fig, path: Path) -> Path:
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def _serve_json(text: str) -> Path:
    """An `echo-bench serve` output folder holding serve.json, or the file itself."""
    path = Path(text)
    if not (path / "serve.json" if path.is_dir() else path).is_file():
        raise argparse.ArgumentTypeError(f"{text}: no serve.json there" if path.is_dir() else f"{text}: no such file")
    return path


def parser() -> Parser:
    ap = Parser(prog="echo-bench figures", description=__doc__.splitlines()[0])
    ap.add_argument("path", type=_serve_json, help="an echo-bench serve output folder, or its serve.json")
    ap.add_argument("--out", type=out_dir, default=None, help="where the PNGs go (default: next to serve.json)")
    ap.add_argument("--markdown", action="store_true", help="also rewrite serve.md from serve.json")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    return run(ap.prog, lambda: _draw(args), args.debug)


def _draw(args) -> None:
    data, folder = load(args.path)
    out = args.out or folder
    out.mkdir(parents=True, exist_ok=True)
    written = render(data, out)
    if args.markdown:
        (out / "serve.md").write_text(markdown(report_from_json(data)))
        written.append(out / "serve.md")
    if not written:
        raise CommandError("nothing written (is matplotlib installed?)")
    for p in written:
        print(p)
