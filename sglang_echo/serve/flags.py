"""Build the sglang server command line + environment for one configuration.

Pure data in, data out (no processes, no torch import unless asked whether CUDA exists; the
environment is read only for the malloc settings, the CUDA platform's defaults and sglang's
ragged-verify mode, which an operator may override), so the launcher, the test fixtures and the
benchmarks all produce identical servers.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sglang_echo.platform.cpu import cpu_has_amx_bf16, cpu_has_bf16_gemm

SPECS = ("none", "ngram", "eagle3", "echo")
# Attention backend registered by sglang_echo.platform (pure torch, supports target-verify).
CPU_ATTENTION_BACKEND = "echo_torch"
# Without CUDA, sglang cannot profile free memory the GPU way; a fixed KV budget keeps the
# pool small (2-core/24 GiB dev boxes) and start-up fast. A speculative server gets this much
# room for its requests' tokens plus the draft slots it holds per running request
# (`cpu_kv_pool_tokens`).
CPU_MAX_TOTAL_TOKENS = 16384
# sglang resets a speculative server to 48 running requests unless told otherwise
# (`arg_groups/speculative_hook.py`), so at 64-256 concurrent users requests queued behind 48
# while a server without speculation ran them all. On the CPU there are no CUDA graphs to size;
# the KV pool decides how many requests fit, and ECHO is built for large batches.
CPU_SPEC_MAX_RUNNING_REQUESTS = 256
# glibc's malloc on the CPU server. By default it serves blocks over its (adaptive) mmap
# threshold with fresh mmaps and trims the heap top whenever 2x that threshold is free, so the
# per-layer attention buffers (MBs per step) are faulted in anew again and again: ~190 minor page
# faults per generated token at 64 users. A fixed 32 MB threshold (glibc's maximum) and no
# trimming keep those blocks on the heap for reuse: the same server side by side made 19x (none)
# and 2.3x (ECHO) fewer faults and served 1.02-1.05x (none) and 1.13-1.15x (ECHO) the tokens/s
# (benchmarks/results/cpu-malloc/).
# A value already in the environment wins; SGLANG_ECHO_MALLOC_TUNING=0 keeps glibc's defaults.
CPU_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(4 << 30)}
# On a CUDA host without sglang-kernel (sglang_echo.platform's CUDA mode) sglang's default attention
# and sampling backends need FlashInfer or sglang-kernel's FA3; its Triton attention and the torch
# sampler need neither. Passed before the arguments after `--`, so those still win.
CUDA_PLATFORM_ARGS = ("--attention-backend", "triton", "--sampling-backend", "pytorch")
RAGGED_VERIFY_MODE_ENV = "SGLANG_RAGGED_VERIFY_MODE"  # sglang's; see ragged_verify_env


@dataclass(frozen=True)
class SpecOptions:
    """Speculative decoding knobs (ignored for spec="none")."""

    num_steps: int = 3
    eagle_topk: int = 1
    num_draft_tokens: int = 4


@dataclass(frozen=True)
class ServerOptions:
    model_path: Path
    port: int = 30000
    host: str = "127.0.0.1"
    spec: str = "none"
    draft_path: Path | None = None
    spec_options: SpecOptions = field(default_factory=SpecOptions)
    device: str | None = None  # None: cuda if available else cpu
    dtype: str | None = None  # None: sglang's "auto" (the checkpoint's dtype)
    max_total_tokens: int | None = None  # None: cpu_kv_pool_tokens() on CPU, sglang's on GPU
    context_length: int | None = None
    max_running_requests: int | None = None
    enable_metrics: bool = False
    # sglang's --enable-deterministic-inference: a request's tokens do not depend on the batch
    # (on the CPU platform: sglang_echo/platform/deterministic.py)
    deterministic: bool = False
    random_seed: int = 0
    # sglang binds a torch.distributed rendezvous port too; pinning it (default port+1) keeps
    # every port we use inside the range we were given instead of a random free one.
    nccl_port: int | None = None
    log_level: str = "info"
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()
    # -- targets without real weights (echo-bench serve on GPUs; `model_load_args`) -----------
    load_format: str | None = None  # sglang's --load-format, e.g. "dummy" (random weights)
    skip_tokenizer_init: bool = False  # prompts arrive as input_ids; outputs come back as ids only
    attention_backend: str | None = None  # overrides the platform's choice (CPU: echo_torch)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True)
class LaunchCommand:
    argv: list[str]
    env: dict[str, str]  # additions to the parent environment
    device: str


class LaunchError(ValueError):
    """A configuration that cannot be launched (message is meant for the user)."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # a broken torch install means no usable GPU
        return False


def resolve_device(device: str | None) -> str:
    """The device asked for, else cuda where it is available, else cpu."""
    return device or ("cuda" if cuda_available() else "cpu")


def sgl_kernel_installed() -> bool:
    """True where a real sglang-kernel is importable (then the platform provides no `sgl_kernel`)."""
    from sglang_echo.platform.kernel_finder import real_sgl_kernel_origin

    return real_sgl_kernel_origin() is not None


def default_dtype(device: str) -> str:
    """The dtype ``make serve`` prepares SmolLM2 in and serves (:func:`dtype_reason` says why)."""
    return dtype_choice(device)[0]


def dtype_reason(device: str) -> str:
    return dtype_choice(device)[1]


def dtype_choice(device: str) -> tuple[str, str]:
    """bfloat16 on GPUs and on CPUs with AMX; float32 on other CPUs. Measured side by side (plain
    decoding, SmolLM2, 8-32 concurrent requests): on an AVX2 CPU float32 serves 1.7-3.1x bf16's
    tokens/s (bf16 GEMMs run through conversions there), on an AVX-512 BF16 one 1.2-1.5x (its bf16
    dot products run on the same vector units, at more work per token); only AMX's matrix unit
    makes bf16 GEMMs cheaper: on an AMX host bf16 serves 1.2x float32's tokens/s at one request
    and 1.3-1.6x at 8-32. float32 is also the dtype in which speculation is token for token plain
    decoding without the batch-invariant mode."""
    if device != "cpu":
        return "bfloat16", "a GPU"
    if cpu_has_amx_bf16():
        return "bfloat16", "this CPU has AMX: bf16 serves 1.2-1.6x float32's tokens/s at 1-32 requests there"
    why = "AVX-512 BF16 but no AMX" if cpu_has_bf16_gemm() else "no native bf16 GEMMs"
    return "float32", f"this CPU has {why}: float32 serves 1.2-3.1x bf16's tokens/s at 8-32 requests there"


def resolve_dtype(dtype: str | None, device: str, prepared_model: bool) -> str | None:
    """The ``--dtype`` a server starts with: the one asked for; else always an explicit one on a
    CPU (sglang's ``auto`` serves a float32 checkpoint in float16) and for the prepared SmolLM2;
    else None (sglang's ``auto``: a user's checkpoint on a GPU in its own dtype)."""
    if dtype is None and (prepared_model or device == "cpu"):
        return default_dtype(device)
    return dtype


def echo_plugin_available() -> bool:
    """True if `sglang_echo.plugin` imports (it is cheap: registration happens in sglang)."""
    if importlib.util.find_spec("sglang_echo.plugin") is None:
        return False
    try:
        importlib.import_module("sglang_echo.plugin")
        return True
    except Exception:
        return False


def _spec_args(opts: ServerOptions) -> list[str]:
    s = opts.spec_options
    if opts.spec == "none":
        return []
    if opts.spec == "ngram":
        return [
            "--speculative-algorithm",
            "NGRAM",
            "--speculative-num-draft-tokens",
            str(s.num_draft_tokens),
        ]
    if opts.spec in ("eagle3", "echo"):
        if opts.spec == "echo" and not echo_plugin_available():
            raise LaunchError(
                "--spec echo: the ECHO plugin (sglang_echo.plugin) is not available yet; "
                "use --spec none|ngram|eagle3 for now."
            )
        if opts.spec == "echo":
            # ECHO derives steps/topk/draft tokens from its own config (and rejects topk < 2),
            # so only the algorithm and the head are passed; ECHO knobs go after `--` or in the
            # SGLANG_ECHO_* environment. No head: ECHO's n-gram drafter (SGLANG_ECHO_DRAFTER=ngram)
            # needs none, and ECHO itself refuses to start an EAGLE-3 drafter without one.
            args = ["--speculative-algorithm", "ECHO"]
            if opts.draft_path is not None:
                args += ["--speculative-draft-model-path", str(opts.draft_path)]
            return args
        if opts.draft_path is None:
            raise LaunchError(
                f"--spec {opts.spec} needs an EAGLE-3 draft head: pass --draft PATH "
                "(a trained head will ship later; for plumbing tests write a random one with "
                "sglang_echo.models.tiny.write_tiny_eagle3_draft)."
            )
        return [
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-draft-model-path",
            str(opts.draft_path),
            "--speculative-num-steps",
            str(s.num_steps),
            "--speculative-eagle-topk",
            str(s.eagle_topk),
            "--speculative-num-draft-tokens",
            str(s.num_draft_tokens),
        ]
    raise LaunchError(f"unknown --spec {opts.spec!r}; choose from {SPECS}")


def last_flag(args: tuple[str, ...] | list[str], flag: str) -> str | None:
    """The value sglang will read for ``flag`` from ``args`` (``--flag V`` or ``--flag=V``; argparse
    keeps the last), or None where they do not set it."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def extra_int_flag(opts: ServerOptions, flag: str) -> int | None:
    """The integer sglang will read for ``flag`` from the arguments passed through after ``--``,
    or None where they do not set it."""
    value = last_flag(opts.extra_args, flag)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"{flag} {value!r}: expected an integer") from None


def draft_slots_per_request(opts: ServerOptions) -> int:
    """KV slots sglang's speculative scheduler holds per running request beyond its tokens, drafting
    or not: 2 x max(steps x topk, draft tokens) at page size 1 (sglang's
    ``mem_cache/allocation_sizing.get_alloc_reserve_per_decode``). 0 without speculation.

    The shape is the one the server will run: ``--speculative-*`` flags passed after ``--`` win
    over ``spec_options``; ECHO's comes from its own config (those flags, then ``SGLANG_ECHO_*``
    in this environment and ``extra_env``), as ``integration/spec.py:handle_server_args`` sets it.
    The server validates the rest.
    """
    if opts.spec == "none":
        return 0
    s = opts.spec_options
    steps, topk, tokens = (
        extra_int_flag(opts, "--speculative-" + name) for name in ("num-steps", "eagle-topk", "num-draft-tokens")
    )
    if opts.spec == "echo":
        from sglang_echo.integration.config import EchoConfigError, load_config

        try:
            cfg = load_config(
                num_steps=steps,
                topk=topk,
                num_draft_tokens=tokens,
                environ={**os.environ, **dict(opts.extra_env)},
                validate=False,
            )
        except EchoConfigError as e:
            raise LaunchError(str(e)) from None
        steps, topk, tokens = cfg.max_depth, cfg.sglang_topk, cfg.resolved_width()
    elif opts.spec == "ngram":  # sglang sets steps = draft tokens // topk, so steps x topk <= draft tokens
        steps, topk, tokens = 1, 1, tokens or s.num_draft_tokens
    else:
        steps, topk, tokens = steps or s.num_steps, topk or s.eagle_topk, tokens or s.num_draft_tokens
    return 2 * max(steps * topk, tokens)


def cpu_kv_pool_tokens(opts: ServerOptions, max_running: int | None) -> int:
    """The CPU server's default KV pool: CPU_MAX_TOTAL_TOKENS for tokens, plus the draft slots of
    ``max_running`` requests for a speculative server, so that it admits requests as a plain server
    does. With the same 16,384 tokens, ECHO started 237 of 256 concurrent requests at once (plain
    decoding: all 256) and the other 19 over a minute, at 0.90x plain decoding's tokens/s
    (``benchmarks/results/serve-smollm2-high-concurrency``)."""
    return CPU_MAX_TOTAL_TOKENS + (max_running or 0) * draft_slots_per_request(opts)


def model_load_args(opts: ServerOptions) -> list[str]:
    """``--load-format``, ``--skip-tokenizer-init`` and ``--attention-backend`` where set. They go
    after the platform's own flags (sglang's parser keeps the last value, so an explicit attention
    backend wins over the platform's) and before the arguments passed through after ``--``."""
    argv = ["--load-format", opts.load_format] if opts.load_format else []
    if opts.skip_tokenizer_init:
        argv.append("--skip-tokenizer-init")
    if opts.attention_backend:
        argv += ["--attention-backend", opts.attention_backend]
    return argv


def build_command(opts: ServerOptions, python: str = sys.executable) -> LaunchCommand:
    device = resolve_device(opts.device)
    argv = [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(opts.model_path),
        "--host",
        opts.host,
        "--port",
        str(opts.port),
        "--nccl-port",
        str(opts.nccl_port if opts.nccl_port is not None else opts.port + 1),
        "--random-seed",
        str(opts.random_seed),
        "--log-level",
        opts.log_level,
    ]
    max_running = opts.max_running_requests
    passed_through = extra_int_flag(opts, "--max-running-requests")  # sizes the pool; sglang reads it
    if max_running is None and passed_through is None and device == "cpu" and opts.spec != "none":
        max_running = CPU_SPEC_MAX_RUNNING_REQUESTS
    env: dict[str, str] = {}
    if device == "cpu":
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        if os.environ.get("SGLANG_ECHO_MALLOC_TUNING", "1") != "0":
            env.update({k: v for k, v in CPU_MALLOC_ENV.items() if k not in os.environ})
        argv += [
            "--device",
            "cpu",
            "--attention-backend",
            CPU_ATTENTION_BACKEND,
            "--sampling-backend",
            "pytorch",
            "--cuda-graph-backend-decode",
            "disabled",
            "--cuda-graph-backend-prefill",
            "disabled",
            "--max-total-tokens",
            str(opts.max_total_tokens or cpu_kv_pool_tokens(opts, passed_through or max_running)),
            # The overlap scheduler's extra thread fights the compute threads for the few
            # cores: measured ~7x slower decode on the 2-core dev box (0.65 vs 0.09 s/token).
            "--disable-overlap-schedule",
            # An idle sglang scheduler busy-polls its sockets (~1 core at 100%); on a shared
            # 2-core box an idle server would halve everyone else's throughput. This makes it
            # block in zmq poll instead (wakes immediately on a request).
            "--sleep-on-idle",
        ]
    else:
        if not sgl_kernel_installed():  # the platform's CUDA mode; its env defaults, for the record
            from sglang_echo.platform.cuda.env import env_defaults

            env.update(env_defaults(os.environ))
            argv += CUDA_PLATFORM_ARGS
        if opts.spec == "echo":  # the one backend that verifies ragged trees under CUDA graphs
            from sglang_echo.kernels.registration import BACKEND_NAME

            argv += ["--attention-backend", BACKEND_NAME]
        if opts.max_total_tokens:
            argv += ["--max-total-tokens", str(opts.max_total_tokens)]
    if opts.dtype:
        argv += ["--dtype", opts.dtype]
    if opts.context_length:
        argv += ["--context-length", str(opts.context_length)]
    if max_running:
        argv += ["--max-running-requests", str(max_running)]
    if opts.enable_metrics:
        argv.append("--enable-metrics")
    if opts.deterministic:
        argv.append("--enable-deterministic-inference")
    argv += _spec_args(opts)
    argv += model_load_args(opts)
    argv += list(opts.extra_args)
    env.update(ragged_verify_env(opts, argv, device))
    env.update(dict(opts.extra_env))
    return LaunchCommand(argv, env, device)


def ragged_verify_env(opts: ServerOptions, argv: list[str], device: str) -> dict[str, str]:
    """``SGLANG_RAGGED_VERIFY_MODE=compact`` for an ECHO server on CUDA whose target decodes with
    ``echo_tree_triton``: sglang then captures the target's verify graphs per token tier, which
    ECHO's ragged verify replays (``sglang_echo/integration/ragged.py``). The mode is sglang's and
    process-wide, so it is set here, for that server only; a value in the environment wins."""
    from sglang_echo.kernels.registration import BACKEND_NAME

    backend = last_flag(argv, "--decode-attention-backend") or last_flag(argv, "--attention-backend")
    if opts.spec != "echo" or device != "cuda" or backend != BACKEND_NAME:
        return {}
    if RAGGED_VERIFY_MODE_ENV in os.environ or RAGGED_VERIFY_MODE_ENV in dict(opts.extra_env):
        return {}
    return {RAGGED_VERIFY_MODE_ENV: "compact"}
