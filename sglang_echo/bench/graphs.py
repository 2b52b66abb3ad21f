"""`echo-bench graphs`: the GPU server's control plane, eager against CUDA graphs, in one run.

For each policy of ``echo-bench scheduler`` it times the path a GPU server runs each step,
``build_trees`` and sglang's dense verify layout (drafter excluded), four ways on the same steps:

* ``eager``: as the worker runs it today, about 660 tensor ops (GPU launches) and 8 host syncs;
* ``graphs``: :class:`~sglang_echo.core.graphs.GraphedTreeBuilder`, one CUDA graph per stage and
  one host read per depth (drafting stops once no request is active, as eagerly);
* ``all depths``: the same graphs with no host read at all (every depth is drafted);
* ``fused`` (``--compile``): the graphs of stages fused by Inductor first;
* ``kernels`` (``--kernels``, ECHO and its ablations only): the graphs of the fused Triton
  control plane, one program per depth and for Priority 2 (``control_kernel="triton"``) and two
  for the layout (:mod:`sglang_echo.kernels.control`).

Every step's layouts (tokens, positions, masks, retrieve arrays) are compared with the eager ones;
``differ`` counts the steps that were not identical. Without CUDA the "graphs" run eagerly (a dry
run of the same stages, and ``kernels`` under Triton's interpreter: a check, not a timing).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import replace

import torch

from ..cli_args import Parser, check_device, name_list, out_file
from ..cli_args import device as device_arg
from ..cli_args import run as run_command
from ..core import PolicyConfig, build_trees, make_policy
from ..core.dense import DenseVerifyTensors, dense_from_padded, to_sglang_dense
from ..core.factory import ELASTIC_POLICIES, max_tree_size
from ..core.graphs import GraphedTreeBuilder
from ..core.synthetic import SyntheticDrafter, SyntheticWorld
from .machine import describe
from .scheduler import TimedDrafter, add_batch_options, bench_cases, case_label, device_sync, median_p99


def same_layout(a: DenseVerifyTensors, b: DenseVerifyTensors) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in DenseVerifyTensors.__dataclass_fields__)


def _fused(kernels: bool):
    """The fused control kernels where asked for (Triton is imported only then)."""
    if not kernels:
        return None
    from ..kernels.control import TRITON

    return TRITON


def time_modes(
    name: str,
    cfg: PolicyConfig,
    batch: int,
    steps: int,
    warmup: int,
    vocab: int,
    device: torch.device,
    compile: bool,
    kernels: bool = False,
) -> dict:
    sync = device_sync(device)
    drafter = TimedDrafter(SyntheticDrafter(SyntheticWorld(batch, vocab=vocab, seed=0, device=device)), sync)
    width = max_tree_size(name, cfg)
    policy = make_policy(name, cfg)

    def graphed(stop_early: bool, fuse: bool, kernels: bool = False) -> GraphedTreeBuilder:
        policy = make_policy(name, replace(cfg, control_kernel="triton" if kernels else "torch"), fused=_fused(kernels))
        lay_out = dict(finish=dense_from_padded)
        if kernels:
            from ..kernels.control import layout  # Triton: imported only when asked for

            lay_out = dict(pad=layout.pad_pool, finish=layout.dense_from_padded)
        return GraphedTreeBuilder(
            policy,
            drafter,
            batch,
            width,
            device,
            stop_early=stop_early,
            compile="inductor" if fuse else None,
            **lay_out,
        )

    modes = {
        "eager": lambda roots, prefix: to_sglang_dense(build_trees(policy, drafter, roots)[0], prefix, width),
        "graphs": graphed(True, False),
        "all depths": graphed(False, False),
        **({"fused": graphed(True, True)} if compile else {}),
        **({"kernels": graphed(True, False, kernels=True)} if kernels else {}),
    }
    ms = {mode: [] for mode in modes}
    first_s = dict.fromkeys(modes, 0.0)  # the first call: capture (and compilation)
    drafts = dict.fromkeys(modes, 0)
    differ = 0
    for seed in range(warmup + steps):
        g = torch.Generator().manual_seed(seed)
        roots = torch.randint(0, vocab, (batch,), generator=g).to(device)
        prefix = torch.randint(16, 2048, (batch,), generator=g).to(device)
        out = {}
        for mode, run in modes.items():
            drafter.seconds, drafter.calls = 0.0, 0
            sync()
            t0 = time.perf_counter()
            out[mode] = run(roots, prefix)
            sync()
            seconds = time.perf_counter() - t0 - drafter.seconds
            if seed == 0:
                first_s[mode] = seconds
            if seed >= warmup:
                ms[mode].append(seconds * 1e3)
                drafts[mode] += drafter.calls
        differ += not all(same_layout(out["eager"], o) for o in out.values())
    return {
        "ms": {m: median_p99(v) for m, v in ms.items()},
        "first_s": first_s,
        "drafts": {m: n / steps for m, n in drafts.items()},
        "differ": differ,
        "steps": warmup + steps,
    }


def parser() -> Parser:
    ap = Parser(prog="echo-bench graphs", description=__doc__.splitlines()[0])
    add_batch_options(ap, batch=64, steps=30, warmup=3)
    ap.add_argument("--device", type=device_arg, default=None, help="default: cuda if available, else cpu")
    ap.add_argument(
        "--compile", action="store_true", help="also fuse each stage with Inductor before capture (slow to build)"
    )
    ap.add_argument(
        "--kernels",
        action="store_true",
        help="also time the fused Triton control kernels (ECHO and its ablations only)",
    )
    ap.add_argument(
        "--policies",
        type=name_list(sorted({n for n, _ in bench_cases(1)}), what="policy"),
        default=None,
        help="comma-separated policy names to keep (default: all)",
    )
    ap.add_argument("--out", type=out_file, default=None, help="also write OUT.json (rows, machine, command)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    check_device(ap, args.device)
    keep = set(args.policies or ())
    if args.kernels:
        keep = (keep or set(ELASTIC_POLICIES)) & set(ELASTIC_POLICIES)
        if not keep:
            ap.error(
                f"--kernels times ECHO and its ablations ({', '.join(sorted(ELASTIC_POLICIES))}); "
                f"--policies {','.join(args.policies)} keeps none of them"
            )
    return run_command(ap.prog, lambda: _bench(args, keep, argv), args.debug)


def _bench(args, keep: set[str], argv: list[str] | None) -> None:
    device = torch.device(args.device)
    if args.kernels and device.type != "cuda":  # a dry run: Triton's interpreter, set before the kernels are imported
        os.environ["TRITON_INTERPRET"] = "1"
    cases = [(n, c) for n, c in bench_cases(args.batch) if not keep or n in keep]
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (no CUDA: graph stages run eagerly)"
    modes = ["eager", "graphs", "all depths"] + ["fused"] * args.compile + ["kernels"] * args.kernels
    print(f"server-path control plane per step (drafter excluded), batch {args.batch}, {args.steps} steps, {where}")
    print(
        f"{'policy (K_max / shape)':<34}"
        + "".join(f"{m[:10]:>12}{'p99':>7}" for m in modes)
        + f"{'speedup':>9}{'drafts':>20}{'first s':>20}{'differ':>8}"
    )
    results = []
    for name, cfg in cases:
        r = time_modes(name, cfg, args.batch, args.steps, args.warmup, args.vocab, device, args.compile, args.kernels)
        results.append({"policy": name, "label": case_label(name, cfg), "config": vars(cfg), "batch": args.batch, **r})
        best = min(r["ms"][m][0] for m in modes[1:])
        print(
            f"{case_label(name, cfg):<34}"
            + "".join(f"{r['ms'][m][0]:12.3f}{r['ms'][m][1]:7.2f}" for m in modes)
            + f"{r['ms']['eager'][0] / best:8.1f}x"
            + "/".join(f"{r['drafts'][m]:.1f}" for m in modes).rjust(20)
            + "/".join(f"{r['first_s'][m]:.1f}" for m in modes).rjust(20)
            + f"{r['differ']:5d}/{r['steps']}",
            flush=True,
        )
    print("ms per step: median and p99; speedup = eager / the fastest graphed median; drafts = draft calls per step")
    print("per mode; first s = the first step's seconds (capture, and compilation for fused); differ = steps whose")
    print("layouts differ from eager in any mode")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        command = "echo-bench graphs " + shlex.join(sys.argv[1:] if argv is None else argv)
        meta = {"command": command, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "device": where, "machine": describe()}
        path = args.out.with_suffix(".json")
        path.write_text(json.dumps({**meta, "rows": results}, indent=2) + "\n")
        print(f"wrote {path}")
