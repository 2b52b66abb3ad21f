"""`echo-bench serve`'s command line: the options, and every check that can fail before any work
(one line ``echo-bench serve: error: ...``, exit status 2)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from ..cli_args import DTYPES, SERVER_DEVICES, Parser, alias, count, has_tokenizer, out_dir, port, positive_int
from ..integration.config import DRAFTERS
from .acceptance_args import prompt_sets
from .arrivals import parse_rates
from .serve_configs import CONFIGS
from .targets import TargetError, parse_base_urls
from .workload import model_folder, parse_token_prompts, vocab_size

DEFAULT_CONFIGS = "none,ngram,eagle3,echo"
DEFAULT_CONCURRENCY = "1,8,32"
DEFAULT_DTYPE = "float32"  # keeps the token-for-token check exact on a CPU
WARMUP_CONCURRENCY = 8
HEAD_FLAGS = {"eagle3": "--draft", "dart": "--dart-draft", "dflash": "--dflash-draft"}  # each drafter's head option
# Options that shape the servers echo-bench starts: meaningless for servers already running.
SERVER_ONLY = (
    "configs",
    "dtype",
    "max_total_tokens",
    "draft",
    "dart_draft",
    "dflash_draft",
    "calibration",
    "load_format",
    "device",
    "attention_backend",
)


def parser(description: str = "") -> Parser:
    ap = Parser(prog="echo-bench serve", description=description)
    add = ap.add_argument
    add("--configs", default=None, help=f"comma list of {','.join(CONFIGS)} (default {DEFAULT_CONFIGS})")
    add(
        "--base-url",
        default=None,
        metavar="URL|NAME=URL,...",
        help="measure servers already running instead of starting them: one URL, or NAME=URL pairs side by side "
        "(none=URL is what speedups and the lossless check compare with)",
    )
    add(
        "--served-model-name",
        default=None,
        metavar="NAME",
        help="the model name OpenAI-only --base-url servers are asked for (default: the first one their "
        "/v1/models lists)",
    )
    add("--concurrency", default=None, help=f"closed-loop levels: clients at once (default {DEFAULT_CONCURRENCY})")
    add(
        "--request-rate",
        default=None,
        metavar="R[,R...]",
        help="open-loop levels instead: Poisson arrivals at R requests/s (seeded; inf: all at once)",
    )
    add(
        "--max-concurrency",
        type=positive_int,
        default=None,
        help="with --request-rate: at most this many requests in flight",
    )
    add(
        "--num-requests",
        type=positive_int,
        default=None,
        help="with --request-rate: requests per level (default: the prompt pool's size)",
    )
    add(
        "--stream",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="stream every response (TTFT and inter-token latency); --no-stream: one response per request",
    )
    add(
        "--ignore-eos",
        action="store_true",
        help="generate --max-new-tokens tokens whatever the model says (random weights)",
    )
    add("--seed", type=int, default=0, help="seeds the Poisson arrivals and --token-prompts")
    add("--rounds", type=count, default=1, help="requests per level = concurrency x rounds")
    add(
        "--min-requests",
        type=count,
        default=0,
        help="at least this many requests per level (low concurrencies in a sweep up to 256)",
    )
    add(
        "--repeats",
        type=positive_int,
        default=1,
        help="passes over the configs, alternating their order; speedups compare runs of one pass",
    )
    add(
        "--interleave",
        action="store_true",
        help="start every config's server at once and run each level of each pass config after config "
        "(ports --port, --port+10, ...): ratios then span one level's minutes, not a whole pass "
        "(--base-url runs always go this way)",
    )
    add(
        "--prompts",
        type=prompt_sets,
        default=None,
        help="comma-separated prompt sets (models/prompts.py) or .jsonl paths (default: every built-in set)",
    )
    add("--per-set", type=positive_int, default=10, help="prompts taken from each prompt set")
    add(
        "--token-prompts",
        default=None,
        metavar="N:LEN",
        help="N prompts of LEN random token ids (seeded, within the model's vocabulary) instead of the prompt "
        "sets; started servers skip tokenizer init",
    )
    add(
        "--simulate",
        default=None,
        metavar="STEM",
        help="simulated acceptance from an echo-replay trace (STEM.sim.json, echo-replay sim-inputs): the trace's "
        "prompts as token ids, ECHO configs with SGLANG_ECHO_SIMULATE=STEM, sglang's EAGLE3 with the "
        "trace's SGLANG_SIMULATE_ACC_LEN; every figure says 'simulated acceptance'",
    )
    add("--max-new-tokens", type=positive_int, default=64, help="generated tokens per request")
    add(
        "--max-new-tokens-jitter",
        type=count,
        default=0,
        help="spread each request's max new tokens over --max-new-tokens +- this (a fixed pattern), so that "
        "plain decoding's requests do not finish in step",
    )
    add(
        "--warmup-requests",
        type=count,
        default=16,
        help=f"requests each server serves unmeasured before its first level, {WARMUP_CONCURRENCY} at a "
        "time, --max-new-tokens tokens each",
    )
    add(
        "--model",
        default=None,
        help="the target to start servers on instead of SmolLM2: a Hugging Face folder or a bare config file "
        "(e.g. benchmarks/configs/llama-3.1-8b.json); with --base-url, where token prompts and the "
        "tokenizer come from",
    )
    add("--load-format", default=None, help="sglang's --load-format for started servers (dummy: random weights)")
    add("--device", choices=SERVER_DEVICES, default=None, help="started servers' device (default: cuda if available)")
    add("--attention-backend", default=None, help="started servers' attention backend (default: the platform's)")
    add("--dtype", choices=DTYPES, default=None, help=f"started servers' dtype (default {DEFAULT_DTYPE})")
    add(
        "--server-args",
        default="",
        help='more sglang flags for every started server, one string (e.g. "--mem-fraction-static 0.25" so that '
        "--interleave's servers share one GPU)",
    )
    add(
        "--max-total-tokens",
        type=positive_int,
        default=None,
        help="every server's KV pool in tokens (default: make serve's: on CPUs 16,384, plus the draft "
        "slots a speculative server holds per running request)",
    )
    add("--draft", default=None, help="EAGLE-3 head, a folder or a bare config (default: the shipped head)")
    add(
        "--echo-drafter",
        choices=DRAFTERS,
        default="eagle3",
        help="the drafter of the echo* configs (echo-dart and echo-ngram pin theirs)",
    )
    add("--dart-draft", default=None, help="DART head for the dart drafter (default: the shipped one)")
    add("--dflash-draft", default=None, help="DFlash head for the dflash drafter (default: the shipped one)")
    add(
        "--calibration",
        default=None,
        help="echo-calibrate output for the echo* configs, or a folder of them / 'shipped' (each config takes "
        "the file made for its drafter; default: paper gates)",
    )
    add("--port", type=port, default=30400, help="the first started server's port")
    add("--out", type=out_dir, default="benchmarks/results/cpu", help="folder for serve.json, serve.md, ...")
    alias(ap, "--model", "--model-dir")
    alias(ap, "--max-new-tokens", "--max-new", "--max-tokens")
    alias(ap, "--max-new-tokens-jitter", "--max-new-jitter", "--max-tokens-jitter")
    return ap


def parse_args(argv: list[str] | None, description: str = "") -> argparse.Namespace:
    """Parsed and checked options. Adds ``config_names``, ``base_urls`` ([(name, URL)] or []),
    ``levels_c`` (closed-loop concurrencies) or ``rates``, ``token_shape`` ((N, LEN) or None),
    ``model_folder`` (the staged ``--model`` or None) and ``head_folders`` (each drafter's given
    head, staged)."""
    ap = parser(description)
    args = ap.parse_args(argv)
    try:
        check(args)
    except (ValueError, TargetError) as e:
        ap.error(str(e))
    return args


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ValueError(f"{flag} {text!r}: expected a comma list of positive integers")
    return values


def check(args: argparse.Namespace) -> None:
    """Fill in the derived fields of :func:`parse_args`; ValueError (one line) on bad input."""
    args.base_urls = parse_base_urls(args.base_url) if args.base_url else []
    if args.base_urls:
        given = [f"--{k.replace('_', '-')}" for k in SERVER_ONLY if getattr(args, k) is not None]
        if given:
            raise ValueError(
                f"{', '.join(given)}: options of the servers echo-bench starts; --base-url measures "
                "running servers (their names come before '=')"
            )
        args.config_names = [name for name, _ in args.base_urls]
    else:
        if args.served_model_name is not None:
            raise ValueError(
                "--served-model-name names the model of OpenAI-only --base-url servers; started "
                "servers serve --model (or SmolLM2)"
            )
        args.config_names = (args.configs or DEFAULT_CONFIGS).split(",")
        unknown = [c for c in args.config_names if c not in CONFIGS]
        if unknown:
            raise ValueError(f"--configs: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(CONFIGS)}")
        args.dtype = args.dtype or DEFAULT_DTYPE
    if args.request_rate is not None:
        if args.concurrency is not None:
            raise ValueError(
                "--concurrency and --request-rate exclude each other; cap an open loop with --max-concurrency"
            )
        args.rates, args.levels_c = parse_rates(args.request_rate), None
    else:
        for flag in ("max_concurrency", "num_requests"):
            if getattr(args, flag) is not None:
                raise ValueError(f"--{flag.replace('_', '-')} applies to --request-rate levels")
        args.rates, args.levels_c = None, _ints(args.concurrency or DEFAULT_CONCURRENCY, "--concurrency")
    args.token_shape = parse_token_prompts(args.token_prompts) if args.token_prompts else None
    args.sim = _simulation(args) if args.simulate else None
    if args.calibration not in (None, "shipped") and not Path(args.calibration).exists():
        raise ValueError(f"--calibration {args.calibration}: no such file or folder (or 'shipped')")
    try:
        shlex.split(args.server_args)
    except ValueError as e:
        raise ValueError(f"--server-args {args.server_args!r}: {e}") from None
    args.model_folder = _target_folder(args) if args.model else None
    if args.model_folder is not None:
        if args.sim is not None and vocab_size(args.model_folder) < args.sim["vocab_size"]:
            raise ValueError(
                f"--simulate: the trace's token ids need a vocabulary of {args.sim['vocab_size']}, "
                f"--model {args.model} has {vocab_size(args.model_folder)}"
            )
        if args.token_shape is not None:
            vocab_size(args.model_folder)  # raises where the config has none
        elif args.sim is None and not has_tokenizer(args.model_folder):
            raise ValueError(
                f"--model {args.model}: no tokenizer there to render the prompt sets; pass --token-prompts N:LEN"
            )
    given = {d: getattr(args, HEAD_FLAGS[d][2:].replace("-", "_")) for d in HEAD_FLAGS}
    args.head_folders = {d: model_folder(Path(p), HEAD_FLAGS[d]) for d, p in given.items() if p}
    if args.model_folder is not None and not args.base_urls:
        _check_heads(args)


def _simulation(args: argparse.Namespace) -> dict:
    """``--simulate STEM``: its sim-inputs, checked against the other options; ECHO configs must
    draft with EAGLE-3 (the trace's drafter), and the generation must fit the trace."""
    from ..replay.sim_inputs import load_sim_inputs

    stem = Path(args.simulate)
    path = stem.parent / f"{stem.name}.sim.json"
    if not path.is_file():
        raise ValueError(f"--simulate {stem}: no {path.name} there (echo-replay sim-inputs --trace {stem})")
    if args.token_prompts:
        raise ValueError("--simulate and --token-prompts exclude each other: the trace's prompts are sent")
    sim = load_sim_inputs(path)
    if args.max_new_tokens > sim["max_new"]:
        raise ValueError(
            f"--max-new-tokens {args.max_new_tokens}: the trace {stem} holds {sim['max_new']} tokens per prompt"
        )
    echo = [c for c in (args.config_names or []) if CONFIGS[c][0] == "echo"]
    other = [c for c in echo if CONFIGS[c][2].get("SGLANG_ECHO_DRAFTER", args.echo_drafter) != sim["drafter"]]
    if other:
        raise ValueError(f"--simulate: {', '.join(other)} draft with another drafter than the trace's {sim['drafter']}")
    args.ignore_eos = True  # the trace's continuations, whatever the model would say
    return {**sim, "stem": str(stem.resolve())}


def _target_folder(args: argparse.Namespace) -> Path:
    try:
        return model_folder(Path(args.model), "--model")
    except ValueError as e:
        hint = " (the model name OpenAI-only servers are asked for is --served-model-name)" if args.base_urls else ""
        raise ValueError(f"{e}{hint}") from None


def _check_heads(args: argparse.Namespace) -> None:
    """Shipped heads are SmolLM2's: another target's speculative configs need theirs given."""
    for name in args.config_names:
        drafter = needed_head(name, args.echo_drafter)
        if drafter is not None and drafter not in args.head_folders:
            raise ValueError(
                f"--configs {name} with --model: pass its {drafter} head ({HEAD_FLAGS[drafter]} DIR "
                "or a bare config file); the shipped heads draft for SmolLM2"
            )


def needed_head(name: str, echo_drafter: str) -> str | None:
    """The drafter whose head config ``name`` loads (None: no head, e.g. none, ngram, echo-ngram)."""
    spec, _, env = CONFIGS[name]
    if spec == "eagle3":
        return "eagle3"
    if spec == "echo":
        drafter = env.get("SGLANG_ECHO_DRAFTER", echo_drafter)
        return None if drafter == "ngram" else drafter
    return None
