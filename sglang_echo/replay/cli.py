"""``echo-replay``: record a trace once, replay any policy at any batch size, price it.

    echo-replay record        --model DIR --drafter eagle3 --prompts humaneval,chat --out out/replay/eagle3
    echo-replay measure-cost  --model DIR --drafter eagle3 --out cost-cpu.json
    echo-replay run           --trace out/replay/eagle3 --cost cost-cpu.json --out results/replay
    echo-replay validate      --trace out/replay/eagle3 --num-prompts 4
    echo-replay validate-server --trace out/replay/eagle3 --num-prompts 4 [--simulate --load-format dummy]
    echo-replay sim-inputs    --trace .sim/smollm2-eagle3 --eagle3-shape 3/3/5

See ``sglang_echo/replay/README.md`` for the trace format, the cost model and the limits.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from sglang_echo.cli_args import prompt_counts, run
from sglang_echo.core.factory import PolicyConfig

from .options import k_max_for, parse_args


def _command(argv) -> str:
    return "echo-replay " + shlex.join(sys.argv[1:] if argv is None else argv)


def _policies(args, trace, batch: int) -> tuple[dict, PolicyConfig]:
    from sglang_echo.bench.acceptance import build_policy

    cfg = PolicyConfig(
        k_max=k_max_for(args.k_max, batch),
        max_depth=args.max_depth,
        w_def=args.w_def,
        w_max=args.w_max,
        topk=args.topk,
        total_tokens=args.total_tokens,
        fixed_tau=args.fixed_tau,
    )
    calib = None
    if args.calibration is not None:
        from sglang_echo.core.calibration_file import load_calibration

        calib = load_calibration(args.calibration, drafter_kind=trace.meta.drafter)
    return {n: build_policy(n, cfg, calib) for n in args.policies}, cfg


def _load_target(path: str, drafter: str, draft: Optional[str], device: str):
    from transformers import AutoModelForCausalLM

    from sglang_echo.bench.acceptance import build_drafter
    from sglang_echo.eval import HFTarget

    dev = torch.device(device)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).to(dev)
    d, captured = build_drafter(drafter, Path(draft) if draft else None, model, dev)
    return HFTarget(model, captured), d


# -- record ----------------------------------------------------------------------------------------
def cmd_record(args, argv) -> None:
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from sglang_echo.bench.acceptance import load_prompt_ids
    from sglang_echo.models.prompts import load

    from .measure import machine
    from .record import assemble, record
    from .trace import TraceMeta

    if args.threads:
        torch.set_num_threads(args.threads)
    draft = args.draft
    if args.drafter == "eagle3" and draft is None:
        from sglang_echo.models.drafts import SMOLLM2_EAGLE3

        draft = SMOLLM2_EAGLE3
    tok = AutoTokenizer.from_pretrained(str(args.target))
    names, prompts = [], []
    for s, n in zip(args.prompts, prompt_counts(args.prompts, args.per_set, args.num_prompts)):
        names += [p.id for p in load(s, n)]
        prompts += load_prompt_ids(s, n, tok, args.max_prompt_len)
    target, drafter = _load_target(args.target, args.drafter, draft, args.device)
    beams = sorted(set(args.beams))
    n_batches = -(-len(prompts) // args.batch)
    bar = tqdm(total=n_batches * (args.max_new + args.depth - 1), desc="record", unit="step")
    trees, outputs, secs = record(
        target,
        drafter,
        prompts,
        max_new=args.max_new,
        depth=args.depth,
        width=args.width,
        beams=beams,
        max_nodes=args.max_nodes,
        batch=args.batch,
        progress=bar.update,
    )
    bar.close()
    params = drafter.describe() if hasattr(drafter, "describe") else ""
    meta = TraceMeta(
        drafter=args.drafter,
        target=str(args.target),
        max_new=args.max_new,
        depth=args.depth,
        width=args.width,
        beams=beams,
        max_nodes=args.max_nodes,
        eos_id=None if args.ignore_eos else tok.eos_token_id,
        vocab_size=target.config.vocab_size,
        draft=str(draft) if draft else None,
        drafter_params={"describe": params} if params else {},
        fingerprints=recorded_fingerprints(args.target, draft),
        prompts=names,
        stats={"record_seconds": secs},
        command=_command(argv),
        machine=machine(),
    )
    trace = assemble(meta, prompts, trees, outputs)
    st, js = trace.save(args.out)
    s = trace.meta.stats
    print(
        f"recorded {trace.num_prompts} streams, {s['trees']} trees, {s['nodes']} nodes "
        f"({s['mean_nodes_per_tree']:.0f}/tree, {s['pruned_nodes']} pruned by the cap) in {secs:.0f}s -> {st}, {js}"
    )


def recorded_fingerprints(target, draft) -> dict[str, str]:
    """The target's and the head's identities, as ``echo-calibrate`` writes them into a calibration."""
    from sglang_echo.core.calibration_file import fingerprint, local_dir

    found = {"model": local_dir(target), "drafter": local_dir(draft) if draft else None}
    return {what: fingerprint(path) for what, path in found.items() if path is not None}


# -- measure-cost ----------------------------------------------------------------------------------
def cmd_measure(args, argv) -> None:
    from .measure import measure

    if args.threads:
        torch.set_num_threads(args.threads)
    draft = args.draft
    if args.drafter == "eagle3" and draft is None:
        from sglang_echo.models.drafts import SMOLLM2_EAGLE3

        draft = SMOLLM2_EAGLE3

    def progress(point):
        print(
            "  " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in point.items()),
            flush=True,
        )

    out = measure(
        Path(args.target),
        drafter=args.drafter,
        draft=Path(draft) if draft else None,
        batches=args.batches,
        per_request=args.tokens_per_request,
        frontiers=args.frontiers,
        catch_up_tokens=args.catch_up_tokens,
        prefix=args.prefix,
        max_tokens=args.max_tokens,
        max_rows=args.max_rows,
        reps=args.reps,
        device=args.device,
        label=args.label,
        command=_command(argv),
        progress=progress,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(
        f"wrote {args.out} ({len(out['verify'])} verify points"
        f"{', ' + str(len(out['draft']['forward'])) + ' draft points' if out['draft'] else ''})"
    )


# -- run ---------------------------------------------------------------------------------------------
def cmd_run(args, argv) -> None:
    from tqdm import tqdm

    from .cost import CostModel
    from .drafter import RecordedDrafter
    from .report import comparison, markdown, print_table
    from .simulate import replay_serving
    from .trace import Trace

    trace = Trace.load(args.trace)
    costs = [CostModel.load(p) for p in args.cost]
    for c in costs:
        c.control_s = args.control_ms / 1e3
    drafter = RecordedDrafter(trace)
    eos = None if args.ignore_eos else trace.meta.eos_id
    batches = args.batch_sizes
    names = args.policies
    rows = []
    bar = tqdm(total=len(batches) * len(names), desc="replay", unit="run")
    for B in batches:
        policies, cfg = _policies(args, trace, B)
        for name, policy in policies.items():
            bar.set_postfix_str(f"{name} B={B}")
            t0 = time.perf_counter()
            res = replay_serving(
                trace,
                policy,
                B,
                k_max=cfg.k_max,
                max_new=args.max_new,
                eos_id=eos,
                min_tokens=args.min_tokens,
                min_steps=args.min_steps,
                drafter=drafter,
            )
            row = {
                "policy_arg": name,
                **res.summary(),
                "policy": policy.name,
                "replay_seconds": time.perf_counter() - t0,
                "throughput": [c.throughput(res, trace.meta.drafter) for c in costs],
            }
            rows.append(row)
            bar.update()
    bar.close()
    title = f"echo-replay run: {trace.meta.drafter} trace of {trace.num_prompts} streams, K_max {args.k_max}"
    print_table(rows, title)
    cmp = comparison(rows)
    print(cmp)
    if args.out is not None:
        stem = args.out.with_suffix("") if args.out.suffix in (".json", ".md") else args.out
        stem.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "command": _command(argv),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "trace": str(args.trace),
            "trace_meta": {k: v for k, v in vars(trace.meta).items() if k not in ("prompts",)},
            "prompts": trace.meta.prompts,
            "k_max": args.k_max,
            "calibration": str(args.calibration) if args.calibration else None,
            "costs": [{"label": c.label, "file": str(p), **c.meta} for c, p in zip(costs, args.cost)],
            "args": {k: v for k, v in vars(args).items() if k != "func"},
        }
        Path(f"{stem}.json").write_text(json.dumps({**meta, "rows": rows}, indent=2, default=str) + "\n")
        cost_note = ", ".join(
            f"{c.label} ({'draft priced' if c.draft_priced(trace.meta.drafter) else 'draft NOT priced'})" for c in costs
        )
        Path(f"{stem}.md").write_text(
            f"`{meta['command']}`\n\nThroughput columns: cost model {costs[0].label if costs else '-'}; "
            f"all cost models in the JSON: {cost_note}.\n\n{markdown(rows)}\n\n{cmp}\n"
        )
        print(f"wrote {stem}.json and {stem}.md")


# -- validate ----------------------------------------------------------------------------------------
def cmd_validate(args, argv) -> int:
    from .trace import Trace
    from .validate import validate

    if args.threads:
        torch.set_num_threads(args.threads)
    trace = Trace.load(args.trace)
    target, drafter = _load_target(
        args.target or trace.meta.target, trace.meta.drafter, args.draft or trace.meta.draft, args.device
    )
    policies, cfg = _policies(args, trace, args.batch)
    prompts = _spread(args.num_prompts, trace.num_prompts)
    eos = None if args.ignore_eos else trace.meta.eos_id
    rows = validate(
        trace, target, drafter, policies, prompts, batch=args.batch, k_max=cfg.k_max, max_new=args.max_new, eos_id=eos
    )
    for r in rows:
        print(
            f"{r['policy']:>16}: {'EXACT' if r['exact'] else 'DIFFERS'}  steps {r['steps']}, "
            f"accept-mismatch steps {r['accept_mismatch_steps']}, size-mismatch steps {r['size_mismatch_steps']}, "
            f"output mismatches {r['output_mismatch']}, committed live {r['live_committed']} "
            f"/ replay {r['replay_committed']}"
        )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "command": _command(argv),
                    "trace": str(args.trace),
                    "prompts": prompts,
                    "batch": args.batch,
                    "k_max": cfg.k_max,
                    "rows": rows,
                },
                indent=2,
            )
            + "\n"
        )
        print(f"wrote {args.out}")
    return 0 if all(r["exact"] for r in rows) else 1


def _spread(n: int, P: int) -> list[int]:
    """``n`` of the trace's ``P`` prompts, spread over its prompt sets (recorded set by set)."""
    n = min(n, P)
    return sorted({i * P // n for i in range(n)})


def cmd_validate_server(args, argv) -> int:
    from .trace import Trace
    from .validate_server import validate_server

    trace = Trace.load(args.trace)
    policies, cfg = _policies(args, trace, 1)
    prompts = _spread(args.num_prompts, trace.num_prompts)
    rows = validate_server(
        trace,
        policies,
        cfg,
        prompts,
        port=args.port,
        calibration=args.calibration,
        max_new=args.max_new,
        eos_id=trace.meta.eos_id,
        simulate=args.trace if args.simulate else None,
        load_format=args.load_format,
    )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "command": _command(argv),
                    "trace": str(args.trace),
                    "prompts": prompts,
                    "k_max": cfg.k_max,
                    "rows": rows,
                },
                indent=2,
            )
            + "\n"
        )
        print(f"wrote {args.out}")
    return 0 if all(r["exact"] for r in rows) else 1


def cmd_sim_inputs(args, argv) -> None:
    from .sim_inputs import TreeShape, sim_inputs
    from .trace import Trace, trace_files

    shape = TreeShape.parse(args.eagle3_shape)
    trace = Trace.load(args.trace)
    out = args.out or trace_files(args.trace)[1].with_suffix(".sim.json")
    data = sim_inputs(trace, Path(args.trace).resolve(), shape, args.max_new)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**data, "command": _command(argv)}, indent=1) + "\n")
    e3 = data["eagle3"]
    print(
        f"SGLANG_SIMULATE_ACC_LEN={e3['simulate_acc_len']}  (static tree {e3['shape']}: {e3['request_steps']} "
        f"request steps, coverage {e3['coverage']['fraction']:.3f}); {len(data['prompts'])} prompts, "
        f"max_new {data['max_new']} -> {out}"
    )


COMMANDS = {
    "record": cmd_record,
    "measure-cost": cmd_measure,
    "run": cmd_run,
    "validate": cmd_validate,
    "validate-server": cmd_validate_server,
    "sim-inputs": cmd_sim_inputs,
}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__.splitlines()[0])
    return run(f"echo-replay {args.cmd}", lambda: COMMANDS[args.cmd](args, argv), args.debug)


if __name__ == "__main__":
    sys.exit(main())
