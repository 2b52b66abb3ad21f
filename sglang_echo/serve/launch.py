"""Launch sglang's real server for sglang-echo (CPU platform when there is no GPU).

    python -m sglang_echo.serve.launch --spec none|ngram|eagle3|echo --port 30000 \
        [--draft PATH] [--model DIR] [--dtype float32] [--enable-metrics] [--deterministic] \
        [--log-file F] [--dry-run] [-- <extra sglang args>]

Prepares SmolLM2-135M-Instruct (cached) unless --model is given, prints what it is about to
run, then exec()s `python -m sglang.launch_server` so signals go straight to sglang.
Exit code 2: a configuration that cannot run (ECHO plugin missing, a draft head for another target).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from sglang_echo.cli_args import DTYPES, SERVER_DEVICES, Parser, model_dir, out_file, port, positive_int, run
from sglang_echo.serve.flags import (
    SPECS,
    LaunchError,
    ServerOptions,
    SpecOptions,
    build_command,
    dtype_reason,
    resolve_device,
    resolve_dtype,
)

PROG = "python -m sglang_echo.serve.launch"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = Parser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--spec", choices=SPECS, default="none", help="the speculative algorithm")
    ap.add_argument("--port", type=port, default=30000, help="the server's port (the next one: its NCCL port)")
    ap.add_argument("--host", default="127.0.0.1", help="the address the server listens on")
    ap.add_argument("--model", type=model_dir, default=None, help="target checkpoint (default: prepared SmolLM2)")
    ap.add_argument(
        "--draft", type=model_dir, default=None, help="EAGLE-3 draft head dir (eagle3/echo; default: the shipped head)"
    )
    ap.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="(default: bfloat16 on GPUs and on CPUs with AMX, else float32: the faster one there)",
    )
    ap.add_argument("--device", choices=SERVER_DEVICES, default=None, help="(default: cuda if available)")
    ap.add_argument("--max-total-tokens", type=positive_int, default=None, help="the KV pool in tokens")
    ap.add_argument("--num-steps", type=positive_int, default=SpecOptions.num_steps, help="eagle3: draft steps")
    ap.add_argument("--eagle-topk", type=positive_int, default=SpecOptions.eagle_topk, help="eagle3: top-k per step")
    ap.add_argument(
        "--num-draft-tokens",
        type=positive_int,
        default=SpecOptions.num_draft_tokens,
        help="eagle3, ngram: draft tokens verified per step",
    )
    ap.add_argument("--enable-metrics", action="store_true", help="sglang's Prometheus metrics")
    ap.add_argument(
        "--deterministic",
        action="store_true",
        help="batch-invariant serving (sglang's --enable-deterministic-inference): a request's "
        "tokens do not depend on what else runs, with or without speculation",
    )
    ap.add_argument("--log-file", type=out_file, default=None, help="send server output here instead of the terminal")
    ap.add_argument("--dry-run", action="store_true", help="print the command and exit")
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="after --: passed to sglang verbatim")
    args = ap.parse_args(argv)
    if args.extra and args.extra[0] == "--":
        args.extra = args.extra[1:]
    return args


def _echo_drafter() -> str:
    from sglang_echo.integration.config import configured_drafter

    return configured_drafter()


def _echo_without_model(spec: str) -> bool:
    """ECHO configured with a parameter-free drafter (SGLANG_ECHO_DRAFTER=ngram) needs no head."""
    return spec == "echo" and _echo_drafter() == "ngram"


def with_shipped_calibration(opts: ServerOptions) -> ServerOptions:
    """ECHO gates with the shipped calibration for this model and drafter, when one matches and
    the user configured none (``SGLANG_ECHO_CALIBRATION`` / ``SGLANG_ECHO_CONFIG`` win)."""
    if os.environ.get("SGLANG_ECHO_CALIBRATION") or os.environ.get("SGLANG_ECHO_CONFIG"):
        return opts
    from sglang_echo.calibration.shipped import shipped_calibration
    from sglang_echo.integration.config import configured_drafter

    path = shipped_calibration(opts.model_path, configured_drafter(), opts.draft_path)
    if path is None:
        print("[sglang-echo] calibration: none shipped for this model/drafter, ECHO gates with the paper's defaults")
        return opts
    print(f"[sglang-echo] calibration: {path} (shipped; SGLANG_ECHO_CALIBRATION overrides it)")
    return replace(opts, extra_env=opts.extra_env + (("SGLANG_ECHO_CALIBRATION", str(path)),))


def with_cpu_budget(opts: ServerOptions, device: str) -> ServerOptions:
    """ECHO on a CPU sets each step's cap from its measured costs (``budget: cost``) unless the
    user configured a budget (``SGLANG_ECHO_BUDGET``, or any ``SGLANG_ECHO_CONFIG`` file).

    A CPU's verify pass is compute-bound from the first token, so the fixed K_max that pays at
    one request makes a batch of 8-32 slower than plain decoding (0.75x / 0.66x,
    ``benchmarks/results/serve-smollm2-interleaved``), where the cost budget decides on plain
    decoding (0.94x / 0.97x in the same run) and still drafts at one request. GPUs keep ECHO's
    fixed K_max: the cost model needs device times, which cost a synchronisation per phase."""
    if device != "cpu" or os.environ.get("SGLANG_ECHO_BUDGET") or os.environ.get("SGLANG_ECHO_CONFIG"):
        return opts
    print("[sglang-echo] budget: cost (CPU default; SGLANG_ECHO_BUDGET=fixed for ECHO's fixed K_max)")
    return replace(opts, extra_env=opts.extra_env + (("SGLANG_ECHO_BUDGET", "cost"),))


def with_cpu_hybrid(opts: ServerOptions, device: str) -> ServerOptions:
    """A head drafter on a CPU drafts together with each request's n-gram drafter (``hybrid``,
    :mod:`sglang_echo.integration.hybrid`) unless the user configured it (``SGLANG_ECHO_HYBRID``,
    or any ``SGLANG_ECHO_CONFIG`` file).

    With SmolLM2's EAGLE-3 head the hybrid accepts 2.4 tokens per step where the head alone
    accepts 1.7 (8 requests, six Spec-Bench-like prompt kinds it was never trained on), and at one
    request serves 1.42x plain decoding (``benchmarks/results/tight-budget-smollm2``; the head
    alone 1.11x, ``benchmarks/results/hybrid-smollm2``). GPUs keep the head alone for now: the n-gram lookups
    run in Python on the host, per request and tree node, and at a GPU's batch sizes the step
    would wait for them."""
    if os.environ.get("SGLANG_ECHO_HYBRID") or os.environ.get("SGLANG_ECHO_CONFIG"):
        return opts
    if device != "cpu" or _echo_drafter() == "ngram":
        return opts
    print(
        "[sglang-echo] hybrid: the head and each request's n-gram drafter draft together "
        "(CPU default; SGLANG_ECHO_HYBRID=0 for the head alone)"
    )
    return replace(opts, extra_env=opts.extra_env + (("SGLANG_ECHO_HYBRID", "1"),))


def with_echo_defaults(opts: ServerOptions, device: str) -> ServerOptions:
    """What ``make serve`` adds to an ECHO server: the shipped calibration, and on a CPU the cost
    budget and hybrid drafting (each unless the user configured it)."""
    return with_cpu_hybrid(with_cpu_budget(with_shipped_calibration(opts), device), device)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run(PROG, lambda: _launch(args), args.debug)


def _launch(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    chosen = args.dtype is None
    args.dtype = resolve_dtype(args.dtype, device, args.model is None)
    opts = ServerOptions(
        model_path=args.model or Path("<prepared>"),
        port=args.port,
        host=args.host,
        spec=args.spec,
        draft_path=args.draft,
        spec_options=SpecOptions(args.num_steps, args.eagle_topk, args.num_draft_tokens),
        device=args.device,
        dtype=args.dtype,
        max_total_tokens=args.max_total_tokens,
        enable_metrics=args.enable_metrics,
        deterministic=args.deterministic,
        extra_args=tuple(args.extra),
    )
    needs_draft = args.spec in ("eagle3", "echo") and args.draft is None and not _echo_without_model(args.spec)
    try:
        # Validate spec/draft before the (possibly slow) model preparation.
        build_command(replace(opts, draft_path=Path("<shipped-head>")) if needs_draft else opts)
    except LaunchError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return e.exit_code

    if args.model is None:
        from sglang_echo.models.prepare import prepare_for_serving

        res = prepare_for_serving(args.dtype)
        print(
            f"[sglang-echo] model: {res.path} ({args.dtype}; "
            f"{'cached' if res.cached else f'prepared in {res.seconds:.0f}s'})"
        )
        if chosen:
            print(f"[sglang-echo] dtype {args.dtype}: {dtype_reason(device)}")
        opts = replace(opts, model_path=res.path)
    else:
        print(f"[sglang-echo] model: {args.model}")
    if needs_draft:
        from sglang_echo.models.drafts import DRAFTER_NAMES, DraftMismatch, shipped_head

        drafter = _echo_drafter() if args.spec == "echo" else "eagle3"
        try:
            args.draft = shipped_head(opts.model_path, drafter)
        except DraftMismatch as e:
            print(f"{PROG}: error: {e}", file=sys.stderr)
            return 2
        opts = replace(opts, draft_path=args.draft)
        print(
            f"[sglang-echo] no --draft given: using the shipped {DRAFTER_NAMES[drafter]} head "
            "(sglang_echo/assets/, see its README)"
        )
    if args.spec == "echo":
        opts = with_echo_defaults(opts, device)
    cmd = build_command(opts)
    if args.draft:
        print(f"[sglang-echo] draft: {args.draft}")
    print(f"[sglang-echo] device: {cmd.device}; spec: {args.spec}; url: {opts.base_url}")
    print("[sglang-echo] env: " + " ".join(f"{k}={v}" for k, v in cmd.env.items()))
    print("[sglang-echo] exec: " + shlex.join(cmd.argv))
    print(f"[sglang-echo] logs: {args.log_file or 'this terminal (stdout/stderr)'}", flush=True)
    if args.dry_run:
        return 0
    if args.log_file:
        args.log_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(args.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    os.execve(cmd.argv[0], cmd.argv, {**os.environ, **cmd.env})
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
