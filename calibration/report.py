"""The calibration's human side: a Markdown report and PNG plots next to the JSON.

Plots (matplotlib, written only when it is installed):

* ``<stem>.confidence_density.png``: accepted vs rejected c_{i,d} per probed depth with tau_d marked,
  the paper's Figures 2 and 6-9 for this model and drafter;
* ``<stem>.auc_by_depth.png``: AUC_d with its bootstrap interval, xi, and the sweet spots;
* ``<stem>.verify_cost.png``: median verify time per verified-token count and the measured K_max.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sglang_echo.core.calibration_file import Calibration

from .probe import ProbeSamples

# The paper's LLaMA-3.1-8B calibration (App. C.4), a sanity reference for the thresholds.
PAPER_REFERENCE = "LLaMA-3.1-8B + EAGLE-3: sweet spots {1, 3, 5}, tau {0.2, 0.35, 0.5} (ECHO App. C.4)"


def markdown(calib: Calibration, samples: ProbeSamples, curve: list[tuple[int, float, int]], command: str) -> str:
    sweet = set(calib.sweet_spots)
    lines = [
        f"# Calibration: {calib.model.get('name')} + {calib.drafter.get('kind')} ({calib.drafter.get('name')})",
        "",
        f"Command: `{command}`"
        + (f" (probe: `{calib.probe['command']}`)" if calib.probe.get("command") not in (None, command) else ""),
        "",
        f"Probe: beam tree depth {calib.probe.get('depth')} x width {calib.probe.get('width')}, "
        f"{calib.probe.get('num_prompts')} prompts, {samples.num_samples} (request, step) samples; "
        f"criterion {calib.criterion}, xi (AUC floor) {calib.auc_min}, target depth {calib.probe.get('target_depth')}.",
        "",
        "| depth | samples | accept rate | AUC [95% CI] | tau_d | mean c (acc / rej) | mean top-1 (acc / rej) "
        "| sweet spot |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in calib.depths:
        lab = samples.labels(r.depth)
        c, t = samples.conf[:, r.depth - 1], samples.top1[:, r.depth - 1]
        lines.append(
            f"| {r.depth} | {r.num_accepted + r.num_rejected} | {r.accept_rate:.3f} | "
            f"{r.auc:.3f} [{r.auc_ci[0]:.3f}, {r.auc_ci[1]:.3f}] | {r.threshold:.3f} | "
            f"{_mean(c[lab]):.3f} / {_mean(c[~lab]):.3f} | {_mean(t[lab]):.3f} / {_mean(t[~lab]):.3f} | "
            f"{'yes' if r.depth in sweet else ''} |"
        )
    mat = 1 + samples.accepted_len.mean()
    lines += [
        "",
        f"D_sig = {list(calib.sweet_spots)}; tau = {[round(calib.threshold(d), 3) for d in calib.sweet_spots]}; "
        f"mean accepted length under the probe tree (incl. bonus): {mat:.2f}.",
        f"Reference: {PAPER_REFERENCE}.",
        "",
        "## Verify cost",
        "",
        "| verified tokens | median verify s | steps |",
        "| --- | --- | --- |",
        *[f"| {n} | {t:.4f} | {k} |" for n, t, k in curve],
        "",
        _kmax_line(calib),
        "",
    ]
    return "\n".join(lines)


def _mean(x: np.ndarray) -> float:
    return float(x.mean()) if len(x) else float("nan")


def plots(calib: Calibration, samples: ProbeSamples, curve: list[tuple[int, float, int]], prefix: Path) -> list[Path]:
    """Write the PNGs as ``<prefix>.<plot>.png``; returns their paths (none without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    sweet = set(calib.sweet_spots)
    D = len(calib.depths)
    cols = min(4, D)
    rows = -(-D // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False)
    bins = np.linspace(0, 1, 26)
    for ax, r in zip(axes.flat, calib.depths):
        lab, c = samples.labels(r.depth), samples.conf[:, r.depth - 1]
        for part, color, name in ((c[lab], "tab:green", "accepted"), (c[~lab], "tab:red", "rejected")):
            if len(part):  # a density of nothing is undefined
                ax.hist(part, bins=bins, density=True, alpha=0.6, color=color, label=name)
        ax.axvline(r.threshold, color="k", ls="--", lw=1)
        ax.set_title(f"d={r.depth} AUC {r.auc:.2f}" + (" *" if r.depth in sweet else ""), fontsize=9)
        ax.set_xlabel("c_{i,d}", fontsize=8)
    for ax in list(axes.flat)[D:]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(
        f"{calib.model.get('name')} + {calib.drafter.get('kind')}: confidence by outcome (-- tau_d, * sweet spot)",
        fontsize=10,
    )
    fig.tight_layout()
    written.append(_save(fig, prefix.with_name(prefix.name + ".confidence_density.png")))

    fig, ax = plt.subplots(figsize=(5, 3.2))
    d = [r.depth for r in calib.depths]
    a = np.array([r.auc for r in calib.depths])
    lo, hi = np.array([r.auc_ci[0] for r in calib.depths]), np.array([r.auc_ci[1] for r in calib.depths])
    ax.errorbar(d, a, yerr=[a - lo, hi - a], fmt="o-", capsize=3, label="AUC_d (95% CI)")
    ax.axhline(calib.auc_min, color="gray", ls=":", label=f"xi = {calib.auc_min}")
    ax.scatter(
        [x for x in d if x in sweet],
        [r.auc for r in calib.depths if r.depth in sweet],
        s=120,
        facecolors="none",
        edgecolors="tab:orange",
        label="sweet spots",
    )
    ax.set_xlabel("draft depth d")
    ax.set_ylabel("AUC")
    ax.legend(fontsize=7)
    fig.tight_layout()
    written.append(_save(fig, prefix.with_name(prefix.name + ".auc_by_depth.png")))

    if curve:
        fig, ax = plt.subplots(figsize=(5, 3.2))
        ax.plot([n for n, _, _ in curve], [t * 1e3 for _, t, _ in curve], "o-")
        if calib.k_max is not None:
            ax.axvline(calib.k_max, color="tab:orange", ls="--", label=f"K_max = {calib.k_max}")
            ax.legend(fontsize=7)
        ax.set_xlabel("verified tokens per step")
        ax.set_ylabel("median verify time (ms)")
        fig.tight_layout()
        written.append(_save(fig, prefix.with_name(prefix.name + ".verify_cost.png")))
    return written


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _kmax_line(calib: Calibration) -> str:
    if calib.k_max is None:
        return "K_max: none measured (too few distinct batch sizes); servers use their device's default."
    where = f"{calib.device['kind']}: {calib.device['name']}" if calib.device else "an unrecorded device"
    return (
        f"K_max: {calib.k_max} (the verify-cost knee, Eq. 2), measured on {where}; servers on that device "
        "use it as the batch's verification cap unless `k_max` is set."
    )
