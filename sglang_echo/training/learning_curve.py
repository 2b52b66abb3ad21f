"""The learning curve of an ``echo-train-drafter`` run as a figure: depth-1 top-1 on the prompt
pool's dev split, per kind and their mean, against the training tokens seen.

``echo-train-drafter`` draws ``learning_curve.png`` next to its report when the run probed the dev
split; to redraw one from a report or a curve file::

    python -m sglang_echo.training.learning_curve OUT/training_report.json [--out FILE.png]

A run that goes on from a head (``--init-from``) continues that head's curve (its
``learning_curve.json``, written beside every trained head) when both probed the same dev split:
this run's tokens count on from where the earlier curve ends, and each point names its run.

matplotlib is optional: without it nothing is drawn (:func:`plot` returns None).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional

CURVE_FILE = "learning_curve.json"  # beside a trained head: the curve of every run that made it


def load(path: Path) -> list[dict]:
    """The curve of a training report (its ``curve``) or of a curve file (the list itself)."""
    data = json.loads(Path(path).read_text())
    curve = data.get("curve") if isinstance(data, dict) else data
    if not isinstance(curve, list) or not curve or "dev_top1_mean" not in curve[0]:
        raise ValueError(f"{path}: no learning curve (a training report of a run with --dev-per-kind, or its curve)")
    return curve


def earlier_curve(head: Path, dev_per_kind: int, kinds: set[str]) -> tuple[list[dict], str]:
    """The curve a head was trained along, if this run's probe measures the same thing: the same
    dev prompts per kind (its ``training_report.json``) and the same kinds. Returns the curve
    (empty when there is none to continue) and why."""
    head = Path(head)
    try:
        curve = load(head / CURVE_FILE)
        report = json.loads((head / "training_report.json").read_text())
    except (OSError, ValueError) as e:
        return [], f"no curve to continue ({e})"
    if report.get("dev_per_kind") != dev_per_kind or set(curve[-1]["dev_top1"]) != kinds:
        return [], f"{head}'s curve probed another dev split ({report.get('dev_per_kind')} prompts a kind)"
    return curve, f"continues {head}'s curve from {curve[-1]['tokens']:,} tokens"


def continued(earlier: list[dict], curve: list[dict]) -> list[dict]:
    """``curve`` after ``earlier``: its tokens counted on from the last earlier point, its points
    tagged with the next run number (the first run's points carry none: run 0)."""
    if not earlier:
        return curve
    base, run = earlier[-1]["tokens"], earlier[-1].get("run", 0) + 1
    return [*earlier, *({**p, "tokens": base + p["tokens"], "run": run} for p in curve)]


def plot(curve: list[dict], out: Path, title: str = "") -> Optional[Path]:
    """Depth-1 top-1 per kind (thin lines) and their mean (thick) against training tokens, to ``out``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    tokens = [p["tokens"] / 1e6 for p in curve]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind in curve[0]["dev_top1"]:
        ax.plot(tokens, [p["dev_top1"][kind][0] for p in curve], lw=1, alpha=0.7, label=kind)
    ax.plot(tokens, [p["dev_top1_mean"][0] for p in curve], lw=3, color="black", label="mean")
    for prev, p in zip(curve, curve[1:]):  # where a run went on from the one before
        if p.get("run", 0) != prev.get("run", 0):
            ax.axvline(p["tokens"] / 1e6, color="grey", ls=":", lw=1)
    ax.set_xlabel("training tokens seen (millions)")
    ax.set_ylabel("depth-1 top-1 on the dev split")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2, loc="upper left")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=Path, help="training_report.json, or a curve JSON")
    ap.add_argument("--out", type=Path, default=None, help="default: learning_curve.png beside REPORT")
    args = ap.parse_args(argv)
    try:
        curve = load(args.report)
    except (OSError, ValueError) as e:
        ap.error(str(e))
    out = plot(curve, args.out or args.report.with_name("learning_curve.png"), title=args.report.parent.name)
    print(f"wrote {out}" if out else "matplotlib is not installed: nothing drawn")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
