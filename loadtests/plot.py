"""One PNG for a sweep: throughput, TTFT, time per output token and errors against users."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402

from .summary import LevelResult  # noqa: E402


def _users_axis(ax: Axes, users: Sequence[int]) -> None:
    # Levels double (8, 16, ... 256): a log2 axis spaces them evenly.
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(users), [str(u) for u in users])
    ax.minorticks_off()
    # The same range on every panel, also on one with nothing drawn (no errors).
    ax.set_xlim(min(users) / 1.4, max(users) * 1.4)
    ax.set_xlabel("concurrent users")
    ax.grid(True, alpha=0.3)


def _percentiles(ax: Axes, results: Sequence[LevelResult], metric: str, title: str) -> None:
    for pct, style in (("p50", "o-"), ("p95", "s--")):
        points = [(r.users, getattr(r, f"{metric}_{pct}_ms")) for r in results]
        points = [(u, v) for u, v in points if v is not None]
        if points:
            ax.plot(*zip(*points), style, label=pct)
    ax.set_title(title)
    ax.set_ylabel("ms")
    if ax.has_data():
        ax.legend()


def _errors(ax: Axes, results: Sequence[LevelResult]) -> None:
    """Stacked bars of error kinds per level, so a level that "got faster" by failing shows."""
    kinds = sorted({k for r in results for k in r.errors})
    bottom = [0] * len(results)
    for kind in kinds:
        counts = [r.errors.get(kind, 0) for r in results]
        # Bars a fraction of each level's own x, so they keep a constant width on the log axis.
        ax.bar([r.users for r in results], counts, width=[r.users * 0.3 for r in results], bottom=bottom, label=kind)
        bottom = [b + c for b, c in zip(bottom, counts)]
    ax.set_title("errors (of requests: " + ", ".join(str(r.requests) for r in results) + ")")
    ax.set_ylabel("failed requests")
    if kinds:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no errors", transform=ax.transAxes, ha="center", va="center")


def plot_levels(results: Sequence[LevelResult], path: Path, *, title: str = "") -> Path:
    users = [r.users for r in results]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), constrained_layout=True)
    tput, ttft, tpot, errs = axes.flat

    tput.plot(users, [r.tokens_per_s for r in results], "o-", color="C0", label="output tokens/s")
    tput.set_ylabel("output tokens/s")
    tput.set_title("throughput (successful requests)")
    reqs = tput.twinx()
    reqs.plot(users, [r.req_per_s for r in results], "s--", color="C1", label="requests/s")
    reqs.set_ylabel("requests/s")
    tput.legend(handles=tput.get_lines() + reqs.get_lines(), loc="upper left")

    _percentiles(ttft, results, "ttft", "time to first token (streaming)")
    _percentiles(tpot, results, "tpot", "time per output token (streaming)")
    _errors(errs, results)
    for ax in axes.flat:
        _users_axis(ax, users)
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
