"""``echo-replay``'s command line: its subcommands' options, and every check that can fail before
a model loads or a trace is read in full (one line ``echo-replay SUBCOMMAND: error: ...``, exit
status 2): trace stems, checkpoint folders, policy and prompt-set names, numbers and their ranges,
and each policy's own shape checks."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from sglang_echo.bench.acceptance_args import build_policy, policy_names, prompt_sets
from sglang_echo.cli_args import (
    Parser,
    add_prompt_counts,
    alias,
    at_least,
    between,
    check_device,
    count,
    device,
    existing_file,
    int_list,
    model_dir,
    out_file,
    port,
    positive_int,
)
from sglang_echo.core.factory import PolicyConfig

DEFAULT_POLICIES = "chain,static-tree,budgeted-chain,dense-gating,fixed-threshold,echo"
REPLAY_DRAFTERS = ("eagle3", "ngram")
counts = int_list(1)


def trace_stem(text: str) -> Path:
    """A recorded trace: STEM names STEM.safetensors and STEM.json, both there."""
    from .trace import trace_files

    missing = [str(p) for p in trace_files(text) if not p.is_file()]
    if missing:
        raise argparse.ArgumentTypeError(f"{text}: no trace there (missing {', '.join(missing)})")
    return Path(text)


def k_max_spec(text: str) -> str:
    """The batch verification cap: an integer >= 1, or Nx (N times the batch size)."""
    if not re.fullmatch(r"[1-9]\d*x?", text.strip()):
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1 or Nx (N times the batch size)")
    return text.strip()


def k_max_for(spec: str, batch: int) -> int:
    return int(spec[:-1]) * batch if spec.endswith("x") else int(spec)


def _eagle3_shape(text: str) -> str:
    from .sim_inputs import TreeShape

    try:
        TreeShape.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix(f"--eagle3-shape {text!r}: ")) from None
    return text


def _max_new_tokens(ap: argparse.ArgumentParser, default: int | None, help: str) -> None:
    ap.add_argument("--max-new-tokens", dest="max_new", metavar="N", type=positive_int, default=default, help=help)
    alias(ap, "--max-new-tokens", "--max-new", "--max-tokens")


def _target(ap: argparse.ArgumentParser, required: bool, help: str) -> None:
    ap.add_argument("--model", dest="target", metavar="DIR", type=model_dir, required=required, default=None, help=help)
    alias(ap, "--model", "--target")


def _torch_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--device", type=device, default="cpu", help="where the target (and head) run")
    ap.add_argument("--threads", type=count, default=0, help="torch intra-op threads (0: torch's default)")


def _policy_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--policies", type=policy_names, default=DEFAULT_POLICIES, help="policies of core.factory or chainN"
    )
    ap.add_argument(
        "--k-max", type=k_max_spec, default="8x", help="batch verification cap: an integer, or Nx = N * batch size"
    )
    ap.add_argument("--max-depth", type=positive_int, default=8, help="draft depth of the policies")
    ap.add_argument("--topk", type=positive_int, default=10, help="static tree")
    ap.add_argument("--total-tokens", type=at_least(2), default=60, help="static tree, root included")
    ap.add_argument("--w-def", type=positive_int, default=1, help="ECHO's default width")
    ap.add_argument("--w-max", type=positive_int, default=4, help="ECHO's widest expansion")
    ap.add_argument("--fixed-tau", type=between(0.0, 1.0), default=0.3, help="the fixed-threshold ablation's gate")
    ap.add_argument(
        "--calibration", type=existing_file, default=None, help="echo-calibrate output (default: paper gates)"
    )
    _max_new_tokens(ap, None, "generated tokens per stream (default: the trace's)")
    ap.add_argument("--ignore-eos", action="store_true", help="streams run --max-new-tokens tokens even past eos")


def _record(sub) -> Parser:
    r = sub.add_parser("record", help="record a trace (target greedy output + a draft tree per position)")
    _target(r, True, "the target's checkpoint folder")
    r.add_argument("--drafter", choices=REPLAY_DRAFTERS, required=True)
    r.add_argument("--draft", type=model_dir, default=None, help="EAGLE-3 head (default: the shipped SmolLM2 head)")
    r.add_argument("--prompts", type=prompt_sets, default="humaneval,chat", help="comma-separated prompt sets")
    add_prompt_counts(r, per_set=8)
    r.add_argument("--max-prompt-len", type=positive_int, default=None, help="keep only the last N prompt tokens")
    _max_new_tokens(r, 128, "generated tokens per stream")
    r.add_argument("--depth", type=positive_int, default=10, help="deepest recorded draft depth (>= any policy's)")
    r.add_argument(
        "--width", type=positive_int, default=10, help="children asked per expanded node (>= any policy's k)"
    )
    r.add_argument("--beams", type=counts, default="1,2,4,10,16", help="beam widths whose frontiers are expanded")
    r.add_argument("--max-nodes", type=positive_int, default=2048, help="node cap per tree, by path score")
    r.add_argument("--batch", type=positive_int, default=8, help="prompts recorded together")
    r.add_argument("--ignore-eos", action="store_true", help="streams never stop at eos on replay")
    _torch_args(r)
    r.add_argument("--out", type=out_file, required=True, help="trace stem: STEM.safetensors + STEM.json")
    return r


def _measure_cost(sub) -> Parser:
    m = sub.add_parser("measure-cost", help="time verify (and draft) forwards on this machine")
    _target(m, True, "the target's checkpoint folder")
    m.add_argument("--drafter", choices=REPLAY_DRAFTERS, default="eagle3")
    m.add_argument("--draft", type=model_dir, default=None, help="EAGLE-3 head (default: the shipped SmolLM2 head)")
    m.add_argument("--batches", type=counts, default="1,8,32,64", help="batch sizes measured")
    m.add_argument("--tokens-per-request", type=counts, default="1,2,4,8,16", help="verify K = B * this")
    m.add_argument(
        "--max-verify-tokens",
        dest="max_tokens",
        metavar="K",
        type=positive_int,
        default=1024,
        help="largest K measured",
    )
    alias(m, "--max-verify-tokens", "--max-tokens")
    m.add_argument("--frontiers", type=counts, default="1,4,10,16", help="draft forward rows = B * this")
    m.add_argument("--max-rows", type=positive_int, default=1024, help="largest draft forward measured")
    m.add_argument("--catch-up-tokens", type=counts, default="1,2,4", help="draft catch-up tokens per request")
    m.add_argument(
        "--prefix", type=positive_int, default=128, help="KV prefix per request (mean prompt + half the output)"
    )
    m.add_argument("--reps", type=positive_int, default=5, help="timed repetitions per point")
    m.add_argument("--label", default="cpu", help="the cost model's name in the results")
    _torch_args(m)
    m.add_argument("--out", type=out_file, required=True, help="the cost curve JSON")
    return m


def _run(sub) -> Parser:
    u = sub.add_parser("run", help="replay policies at several batch sizes and model their throughput")
    u.add_argument("--trace", type=trace_stem, required=True, help="trace stem (echo-replay record --out)")
    u.add_argument(
        "--cost", type=existing_file, action="append", default=[], help="cost curve JSON (repeatable: CPU, GPU)"
    )
    u.add_argument("--batch-sizes", type=counts, default="1,8,32,64,128,256", help="batch sizes replayed")
    u.add_argument(
        "--min-tokens",
        type=positive_int,
        default=None,
        help="committed tokens per run (default: one pass of the trace)",
    )
    u.add_argument("--min-steps", type=positive_int, default=32, help="steps per run at least")
    u.add_argument(
        "--control-ms",
        type=at_least(0.0, float),
        default=0.0,
        help="the policy's control plane per drafting step, ms (echo-bench scheduler / graphs); 0: unpriced",
    )
    _policy_args(u)
    u.add_argument("--out", type=out_file, default=None, help="write OUT.json and OUT.md")
    return u


def _validate(sub) -> Parser:
    v = sub.add_parser("validate", help="replay == the offline engine, step for step, on trace prompts")
    v.add_argument("--trace", type=trace_stem, required=True, help="trace stem (echo-replay record --out)")
    _target(v, False, "the target's checkpoint folder (default: the trace's)")
    v.add_argument("--draft", type=model_dir, default=None, help="default: the trace's")
    v.add_argument("--num-prompts", type=positive_int, default=4, help="trace prompts checked, spread over its sets")
    v.add_argument("--batch", type=positive_int, default=4, help="prompts decoded together")
    _torch_args(v)
    _policy_args(v)
    v.add_argument("--out", type=out_file, default=None, help="the comparison JSON")
    return v


def _validate_server(sub) -> Parser:
    vs = sub.add_parser("validate-server", help="replay == a real sglang ECHO server, request by request")
    vs.add_argument("--trace", type=trace_stem, required=True, help="trace stem (echo-replay record --out)")
    vs.add_argument("--num-prompts", type=positive_int, default=4, help="trace prompts checked, spread over its sets")
    vs.add_argument("--port", type=port, default=30430, help="the server's port")
    _policy_args(vs)
    vs.add_argument(
        "--simulate",
        action="store_true",
        help="serve in simulated-acceptance mode on this trace (SGLANG_ECHO_SIMULATE)",
    )
    vs.add_argument("--load-format", default=None, help="sglang's --load-format for the target, e.g. dummy")
    vs.add_argument("--out", type=out_file, default=None, help="the comparison JSON")
    return vs


def _sim_inputs(sub) -> Parser:
    si = sub.add_parser("sim-inputs", help="a simulated-acceptance benchmark's prompts and EAGLE3 accept length")
    si.add_argument("--trace", type=trace_stem, required=True, help="trace stem (echo-replay record --out)")
    si.add_argument(
        "--eagle3-shape", type=_eagle3_shape, default="3/3/5", help="sglang EAGLE3's steps/topk/draft tokens"
    )
    _max_new_tokens(si, None, "tokens per request (default: the trace's)")
    si.add_argument("--out", type=out_file, default=None, help="default: STEM.sim.json")
    return si


def parser(description: str = "") -> tuple[Parser, dict[str, Parser]]:
    """The top-level parser and each subcommand's, by name."""
    ap = Parser(prog="echo-replay", description=description, debug_flag=False)
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="SUBCOMMAND")
    subs = [add(sub) for add in (_record, _measure_cost, _run, _validate, _validate_server, _sim_inputs)]
    return ap, {p.prog.split()[-1]: p for p in subs}


def parse_args(argv: list[str] | None, description: str = "") -> argparse.Namespace:
    """Parsed and checked options (``args.cmd`` names the subcommand)."""
    ap, subs = parser(description)
    args = ap.parse_args(argv)
    sub = subs[args.cmd]
    check_device(sub, getattr(args, "device", None))
    if args.cmd == "validate-server" and args.ignore_eos:
        sub.error("--ignore-eos is not supported (the server stops at eos)")
    if hasattr(args, "policies"):  # every policy's own shape checks, at batch 1
        cfg = PolicyConfig(
            k_max=k_max_for(args.k_max, 1),
            max_depth=args.max_depth,
            w_def=args.w_def,
            w_max=args.w_max,
            topk=args.topk,
            total_tokens=args.total_tokens,
            fixed_tau=args.fixed_tau,
        )
        try:
            for name in args.policies:
                build_policy(name, cfg)
        except ValueError as e:
            sub.error(str(e))
    return args
