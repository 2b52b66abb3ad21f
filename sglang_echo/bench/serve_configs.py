"""`echo-bench serve`'s configurations: each a real sglang server (the README table in
``benchmarks/README.md`` lists them), and how ``--echo-drafter`` and ``--calibration`` reach the
ECHO ones."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from ..serve.flags import SpecOptions

# name -> (spec, speculative knobs, extra environment). EAGLE-3's static tree uses the paper's
# streamlined high-concurrency shape (depth 3, top-k 3, 5 tokens); ECHO its own defaults.
CONFIGS: dict[str, tuple[str, SpecOptions, dict[str, str]]] = {
    "none": ("none", SpecOptions(), {}),
    # A second plain server: its ratio to `none` is what this host's noise alone gives (an A/A control).
    "none-twin": ("none", SpecOptions(), {}),
    "ngram": ("ngram", SpecOptions(num_draft_tokens=8), {}),
    "eagle3": ("eagle3", SpecOptions(num_steps=3, eagle_topk=3, num_draft_tokens=5), {}),
    # sglang's own shape for a Llama target when none is given (sglang 0.5.23,
    # `_auto_choose_speculative_params`: 5 steps, top-4, 8 draft tokens).
    "eagle3-default": ("eagle3", SpecOptions(num_steps=5, eagle_topk=4, num_draft_tokens=8), {}),
    "echo": ("echo", SpecOptions(), {"SGLANG_ECHO_POLICY": "echo"}),
    # The ECHO worker's baseline policies (ECHO Sec. 5.1), on the same drafter and verify path:
    # a chain of ECHO's max depth, static trees of EAGLE-3's 8/10/60 and the streamlined 3/3/5
    # (depth / top-k / tokens), and a chain cut to the batch cap K_max.
    "echo-chain": ("echo", SpecOptions(), {"SGLANG_ECHO_POLICY": "chain"}),
    "echo-static-8x10x60": (
        "echo",
        SpecOptions(),
        {
            "SGLANG_ECHO_POLICY": "static-tree",
            "SGLANG_ECHO_MAX_DEPTH": "8",
            "SGLANG_ECHO_W_MAX": "10",
            "SGLANG_ECHO_WIDTH": "60",
        },
    ),
    "echo-static-3x3x5": (
        "echo",
        SpecOptions(),
        {
            "SGLANG_ECHO_POLICY": "static-tree",
            "SGLANG_ECHO_MAX_DEPTH": "3",
            "SGLANG_ECHO_W_MAX": "3",
            "SGLANG_ECHO_WIDTH": "5",
        },
    ),
    "echo-budgeted-chain": ("echo", SpecOptions(), {"SGLANG_ECHO_POLICY": "budgeted-chain"}),
    # ECHO's tree shape before the measured default (W_def 2, W_max 4): a chain widened to 2 at a
    # truncation; `echo-cost` of that shape beside it.
    "echo-w1x2": (
        "echo",
        SpecOptions(),
        {"SGLANG_ECHO_POLICY": "echo", "SGLANG_ECHO_W_DEF": "1", "SGLANG_ECHO_W_MAX": "2"},
    ),
    "echo-cost-w1x2": (
        "echo",
        SpecOptions(),
        {
            "SGLANG_ECHO_POLICY": "echo",
            "SGLANG_ECHO_BUDGET": "cost",
            "SGLANG_ECHO_W_DEF": "1",
            "SGLANG_ECHO_W_MAX": "2",
        },
    ),
    # The same ECHO trees verified padded-dense (B*W target tokens per step) instead of ragged.
    "echo-padded": ("echo", SpecOptions(), {"SGLANG_ECHO_POLICY": "echo", "SGLANG_ECHO_VERIFY": "padded"}),
    # ECHO Sec. 5.3's gating ablation: a gate at every depth / one threshold at the sweet spots.
    "echo-dense": ("echo", SpecOptions(), {"SGLANG_ECHO_POLICY": "dense-gating"}),
    "echo-fixed": ("echo", SpecOptions(), {"SGLANG_ECHO_POLICY": "fixed-threshold"}),
    # ECHO gating with the paper's LLaMA-3.1-8B thresholds whatever --calibration says.
    "echo-paper": ("echo", SpecOptions(), {"SGLANG_ECHO_POLICY": "echo"}),
    # ECHO with a fixed drafter whatever --echo-drafter says (drafters side by side in one run).
    "echo-dart": ("echo", SpecOptions(), {"SGLANG_ECHO_POLICY": "echo", "SGLANG_ECHO_DRAFTER": "dart"}),
    "echo-ngram": ("echo", SpecOptions(), {"SGLANG_ECHO_POLICY": "echo", "SGLANG_ECHO_DRAFTER": "ngram"}),
    "echo-dflash": ("echo", SpecOptions(), {"SGLANG_ECHO_POLICY": "echo", "SGLANG_ECHO_DRAFTER": "dflash"}),
    # Each step's cap from the measured cost model instead of a fixed K_max (core.budget).
    "echo-cost": ("echo", SpecOptions(), {"SGLANG_ECHO_POLICY": "echo", "SGLANG_ECHO_BUDGET": "cost"}),
    # The same with EAGLE's draft extend on every step, plain ones included (lazy extend off).
    "echo-cost-eager": (
        "echo",
        SpecOptions(),
        {"SGLANG_ECHO_POLICY": "echo", "SGLANG_ECHO_BUDGET": "cost", "SGLANG_ECHO_LAZY_EXTEND": "0"},
    ),
    # The same with a K_max exploration every 64 steps whatever they find (no back-off).
    "echo-cost-explore64": (
        "echo",
        SpecOptions(),
        {"SGLANG_ECHO_POLICY": "echo", "SGLANG_ECHO_BUDGET": "cost", "SGLANG_ECHO_EXPLORE_BACKOFF": "1"},
    ),
    # Hybrid drafting: the head and each request's n-gram drafter draft one tree (integration.hybrid).
    "echo-hybrid": ("echo", SpecOptions(), {"SGLANG_ECHO_POLICY": "echo", "SGLANG_ECHO_HYBRID": "1"}),
    "echo-cost-hybrid": (
        "echo",
        SpecOptions(),
        {"SGLANG_ECHO_POLICY": "echo", "SGLANG_ECHO_BUDGET": "cost", "SGLANG_ECHO_HYBRID": "1"},
    ),
    # ECHO that never drafts (a cap of the roots alone): what its plain steps cost beyond plain decoding,
    # the floor the cost budget reaches where it decides not to speculate.
    "echo-plain": ("echo", SpecOptions(), {"SGLANG_ECHO_POLICY": "echo", "SGLANG_ECHO_K_MAX": "1"}),
    "echo-ngram-cost": (
        "echo",
        SpecOptions(),
        {"SGLANG_ECHO_POLICY": "echo", "SGLANG_ECHO_DRAFTER": "ngram", "SGLANG_ECHO_BUDGET": "cost"},
    ),
}
UNCALIBRATED = {"echo-paper"}


def echo_env(name: str, args: argparse.Namespace, pick=None) -> dict[str, str]:
    """The ECHO configs' drafter and calibration (``--echo-drafter``, ``--calibration``).

    With ``--calibration DIR`` (or ``shipped``), ``pick(drafter)`` is the file there made for the
    model and that drafter (or None), and every ECHO config gates with its own drafter's; a file
    applies to the configs whose drafter is not pinned."""
    env = dict(CONFIGS[name][2])
    if CONFIGS[name][0] == "echo":
        pinned = "SGLANG_ECHO_DRAFTER" in env
        env.setdefault("SGLANG_ECHO_DRAFTER", args.echo_drafter)
        calib = None
        if pick is not None:
            calib = pick(env["SGLANG_ECHO_DRAFTER"])
        elif args.calibration and not pinned:
            calib = Path(args.calibration).resolve()
        if calib is not None and name not in UNCALIBRATED:
            env["SGLANG_ECHO_CALIBRATION"] = str(calib)
    return env


def calibration_dir(args: argparse.Namespace) -> Optional[Path]:
    """The folder ``--calibration`` names (``shipped``: the package's), or None for a file / none."""
    if args.calibration == "shipped":
        from ..calibration.shipped import SHIPPED

        return SHIPPED
    return Path(args.calibration) if args.calibration and Path(args.calibration).is_dir() else None
