"""`echo-bench serve`: tokens/s, latency and accepted length of sglang servers, side by side.

Every configuration serves the same prompts with the same target, dtype, draft head and load
levels, in one run, so the printed ratios compare like with like. Greedy outputs of every
speculative configuration are checked against no speculation (``none``).

    echo-bench serve --configs none,ngram,eagle3,echo --concurrency 1,8,32 --max-new-tokens 64
    echo-bench serve --configs none,eagle3,echo,echo-dart,echo-ngram   # drafters side by side
    echo-bench serve --configs none,echo,echo-dense,echo-fixed --calibration C.json   # Sec. 5.3 ablation
    echo-bench serve --base-url none=http://h:30000,echo=http://h:30001 --request-rate 4,16,inf
    echo-bench serve --configs none,echo --model benchmarks/configs/llama-3.1-8b.json \\
        --load-format dummy --token-prompts 256:512 --device cuda --draft H --dtype bfloat16

Servers are started here (``--configs``: :mod:`.serve_configs`), or already running
(``--base-url``: :mod:`.targets`). Levels are closed loops of ``--concurrency`` clients, or Poisson
arrivals at ``--request-rate`` (:mod:`.load`, :mod:`.arrivals`). Writes ``<out>/serve.json``
(machine, settings, per-run figures, per-request records), ``<out>/serve.md``,
``<out>/requests.jsonl`` (every request: :mod:`.requests_log`), and with matplotlib
``throughput.png`` (ECHO Fig. 5's shape), ``utilisation.png`` (Fig. 4) and ``budget.png``
(:mod:`.figures`; ``echo-bench figures DIR`` redraws them from a ``serve.json``). Besides tokens/s,
request throughput, latency percentiles (end to end; TTFT and inter-token latency when streamed:
:mod:`.latency`) and MAT every run reports:

* per request (``per_request``): MAT = completion_tokens / spec_verify_ct, the draft depth
  (ECHO: the request's mean tree depth per step, from ``meta_info["echo_tree_depth"]``; static
  EAGLE-3: ``--speculative-num-steps``; n-gram: none) and draft utilisation u = MAT / depth
  over the steps that drafted (ECHO Sec. 5.1; MAT includes the bonus token), summarised as
  median and quartiles;
* for ECHO servers (``echo``, from the ``echo_*`` Prometheus counters before and after the
  level): verified tokens per step (sum K_i) against K_max and the control-plane share of the
  step time (``echo_control_seconds_total / echo_step_seconds_total``; goal: <= 3%).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, ExitStack
from dataclasses import asdict
from pathlib import Path

from ..cli_args import CommandError, has_tokenizer
from ..cli_args import run as run_command
from .latency import quartiles
from .load import Level, run_level
from .machine import describe
from .requester import Outcome, send
from .requests_log import json_ready, write_requests
from .serve_args import needed_head, parse_args
from .serve_configs import calibration_dir
from .serve_endpoint import (
    Bench,
    Endpoint,
    StartedServer,
    level_requests,
    max_new_tokens,
    measure,
    running_server,
    warm_up,
    warmup_level,
)
from .serve_run import Report, Run, report_from_json, request_record
from .serve_tables import markdown
from .targets import Target, TargetError, probe
from .workload import PromptItem, text_prompts, token_prompts, vocab_size

__all__ = [
    "Report",
    "Run",
    "level_requests",
    "main",
    "markdown",
    "max_new_tokens",
    "quartiles",
    "report_from_json",
    "request_record",
    "run",
    "warmup_level",
    "write",
]


def run(args: argparse.Namespace) -> Report:
    """Measure every config at every level (``args`` from :func:`serve_args.parse_args`)."""
    if args.base_urls:
        targets = [probe(name, url, args.served_model_name) for name, url in args.base_urls]
        bench = _bench(args, None, {}, None, _prompt_source(args, targets))
        settings = {
            "targets": {t.name: {"url": t.url, "api": t.api, "model": t.model or t.model_path} for t in targets}
        }
        runs = _side_by_side(bench, [lambda _i, t=t: running_server(bench, t) for t in targets])
    else:
        model = args.model_folder or _prepared(args.dtype)
        heads = _heads(args, model)
        calib_dir = calibration_dir(args)
        pick = None if calib_dir is None else _calibration_picker(model, heads, calib_dir)
        bench = _bench(args, model, heads, pick, model)
        settings = {
            "model": str(model),
            "draft": str(heads.get("eagle3")),
            "heads": {d: str(h) for d, h in heads.items()},
            "dtype": args.dtype,
            "device": args.device,
            "load_format": args.load_format,
            "attention_backend": args.attention_backend,
            "echo_drafter": args.echo_drafter,
            "calibration": args.calibration,
            "max_total_tokens": args.max_total_tokens,
        }
        runs = _started_runs(bench)
    report = Report(
        machine={**describe(), "cpus": os.cpu_count()}, settings=json_ready({**settings, **_load_settings(bench)})
    )
    report.runs += runs
    return report


def _load_settings(bench: Bench) -> dict:
    a = bench.args
    return {
        "configs": a.config_names,
        "levels": [lv.key for lv in bench.levels],
        "mode": "concurrency" if a.rates is None else "request-rate",
        "concurrency": a.levels_c,
        "request_rate": a.rates,
        "max_concurrency": a.max_concurrency,
        "num_requests": a.num_requests,
        "seed": a.seed,
        "stream": a.stream,
        "ignore_eos": a.ignore_eos,
        "max_new": a.max_new_tokens,
        "max_new_jitter": a.max_new_tokens_jitter,
        "prompts": len(bench.items),
        "per_set": a.per_set,
        "prompt_sets": a.prompts,
        "token_prompts": a.token_prompts,
        "warmup_requests": a.warmup_requests,
        "lossless": _lossless_note(a),
        **(
            {"simulated": {"label": a.sim["label"], "trace": a.sim["stem"], "eagle3": a.sim["eagle3"]}} if a.sim else {}
        ),
    }


def _lossless_note(args: argparse.Namespace) -> str:
    """What the lossless column compares (serve.md says it under the machine line)."""
    if "none" not in args.config_names:
        return "not checked: no `none` config to compare with"
    if args.base_urls:
        return (
            "greedy outputs of every --base-url server against the `none` URL's (token ids from sglang's "
            "/generate, text from an OpenAI-only server)"
        )
    return "greedy output token ids of every config against `none` (a server started by echo-bench)"


def _bench(args: argparse.Namespace, model: Path | None, heads: dict, pick, source: Path | None) -> Bench:
    items = _prompt_items(args, source)
    if args.rates is None:
        levels = [Level(c) for c in args.levels_c]
    else:
        n = args.num_requests or len(items)
        levels = [Level(args.max_concurrency or n, rate) for rate in args.rates]
    return Bench(args, model, heads, pick, levels, items)


def _prompt_items(args: argparse.Namespace, source: Path | None) -> list[PromptItem]:
    """The pool: token prompts within ``source``'s vocabulary, or the prompt sets rendered with its
    tokenizer (SmolLM2's when ``source`` is None)."""
    if args.sim is not None:  # the trace's prompts: what the simulating servers follow
        return [PromptItem(q["id"], "trace", input_ids=tuple(q["input_ids"])) for q in args.sim["prompts"]]
    if args.token_shape is not None:
        if source is None:
            raise TargetError(
                "--token-prompts with --base-url: pass --model (a folder or config with the served model's vocab_size)"
            )
        n, length = args.token_shape
        return token_prompts(n, length, vocab_size(source), args.seed)
    from transformers import AutoTokenizer

    return text_prompts(args.per_set, AutoTokenizer.from_pretrained(source or _prepared("float32")), args.prompts)


def _prompt_source(args: argparse.Namespace, targets: Sequence[Target]) -> Path | None:
    """Where ``--base-url`` runs take the vocabulary or tokenizer from: ``--model``, else a model
    folder a native server reports and this machine has, else None (SmolLM2 for text prompts)."""
    if args.model_folder is not None:
        return args.model_folder
    for t in targets:
        if t.model_path and (Path(t.model_path) / "config.json").is_file():
            folder = Path(t.model_path)
            if args.token_shape is not None or has_tokenizer(folder):
                return folder
    if args.token_shape is None:
        print(
            "[echo-bench] prompts rendered with SmolLM2's chat template (pass --model for the served model's)",
            flush=True,
        )
    return None


def _prepared(dtype: str) -> Path:
    from ..models.prepare import prepare

    return prepare(dtype=dtype).path


def _heads(args: argparse.Namespace, model: Path) -> dict[str, Path]:
    """Each needed drafter's head: the one given (a folder or a bare config), else the shipped one."""
    from ..models.drafts import shipped_head

    drafters = {d for name in args.config_names if (d := needed_head(name, args.echo_drafter))}
    return {d: args.head_folders.get(d) or shipped_head(model, d) for d in sorted(drafters)}


def _calibration_picker(model: Path, heads: dict[str, Path], calib_dir: Path) -> Callable:
    from ..calibration.shipped import shipped_calibration

    return lambda drafter: shipped_calibration(model, drafter, heads.get(drafter), calib_dir)


def _in_order(names: list[str], rep: int) -> list[str]:
    """Pass ``rep``'s order: alternating, so that a drifting machine (shared VMs drift 10-30% over
    minutes) favours no config."""
    return names if rep % 2 == 0 else names[::-1]


def _started_runs(bench: Bench) -> list[Run]:
    """Servers started here: one after the other, each through every level of a pass, or with
    ``--interleave`` all at once (ports --port, --port+10, ...)."""
    args, names = bench.args, bench.args.config_names
    if args.interleave:
        servers = [StartedServer(bench, n, args.port + 10 * i) for i, n in enumerate(names)]
        try:
            for server in servers:  # from this thread, which outlives them (StartedServer.launch)
                server.launch()
        except BaseException:
            for server in servers:
                if server.srv is not None:
                    server.srv.stop()
            raise
        return _side_by_side(bench, [lambda i, s=s: s for s in servers])
    runs = []
    for rep in range(args.repeats):
        for name in _in_order(names, rep):
            with StartedServer(bench, name, args.port) as ep:
                warm_up(bench, ep)
                runs += [measure(bench, ep, level, rep) for level in bench.levels]
    return runs


def _side_by_side(bench: Bench, openers: Sequence[Callable[[int], AbstractContextManager[Endpoint]]]) -> list[Run]:
    """Every server up at once (started ones sleep while idle), and each level of each pass run for
    every server back to back: what drifts in between is one level's minutes, not a whole pass's."""
    runs = []
    with ExitStack() as stack:
        endpoints = _enter_all(stack, [opener(i) for i, opener in enumerate(openers)])
        for ep in endpoints:  # one at a time: servers warming up together share a CPU host's cores
            warm_up(bench, ep)
        for rep in range(bench.args.repeats):
            for level in bench.levels:
                runs += [measure(bench, ep, level, rep) for ep in _in_order(endpoints, rep)]
    return runs


def _enter_all(stack: ExitStack, contexts: Sequence[AbstractContextManager[Endpoint]]) -> list[Endpoint]:
    """Enter every server at once (their starts overlap: minutes on a GPU host, where each JIT-compiles
    and loads on its own cores); each one entered is left through ``stack``, also when another fails."""
    with ThreadPoolExecutor(max_workers=max(len(contexts), 1)) as pool:
        futures = [pool.submit(cm.__enter__) for cm in contexts]
        wait(futures)
    endpoints, error = [], None
    for cm, fut in zip(contexts, futures):
        if fut.exception() is None:
            stack.push(cm.__exit__)
            endpoints.append(fut.result())
        elif error is None:
            error = fut.exception()
    if error is not None:
        raise error
    return endpoints


def _one_level(
    url: str, texts: list[str], concurrency: int, max_new: Sequence[int]
) -> tuple[float, list[Outcome], list[float]]:
    """Send ``texts`` (``max_new[i]`` tokens each, not streamed) to the sglang server at ``url`` with
    ``concurrency`` clients; wall seconds, the outcomes (``output_ids``, ``meta``), each latency."""
    target = Target("server", url)
    items = [PromptItem(str(i), "", text=t) for i, t in enumerate(texts)]
    seconds, outs = run_level(lambda i: send(target, items[i], max_new[i], stream=False), len(texts), concurrency)
    return seconds, outs, [o.latency for o in outs]


def _ms(summary: dict | None, what: str) -> str:
    p = (summary or {}).get(what)
    return f"{what} p50 {1e3 * p['p50']:.0f} ms" if p else ""


def _progress(r: Run) -> str:
    mat = f"{r.mat:.2f}" if r.mat else "-"
    level = f"c={r.concurrency:<3}" if r.request_rate is None else Level(r.concurrency, r.request_rate).label
    line = (
        f"{r.config:>10} {level} {r.tokens_per_s:7.2f} tok/s  {r.requests_per_s:5.2f} req/s  MAT {mat:>5}  "
        f"lossless {r.lossless}"
    )
    for what in ("ttft", "itl"):
        if part := _ms(r.latency, what):
            line += "  " + part
    if r.cpu_ms_per_token is not None:
        line += f"  server CPU {r.cpu_ms_per_token:.1f} ms/token"
    if r.repeat:
        line = f"[pass {r.repeat + 1}] " + line
    u = r.utilisation
    if u:
        line += f"  u {u['median']:.2f} [{u['q1']:.2f}-{u['q3']:.2f}]"
    e = r.echo or {}
    if e.get("verified_per_step") is not None:
        line += f"  verified/step {e['verified_per_step']:.1f} (K_max {e.get('k_max') or 0:.0f})"
    if e.get("control_share") is not None:
        line += f"  control {100 * e['control_share']:.1f}% of {e['step_ms']:.1f} ms/step"
    return line


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__.splitlines()[0])
    return run_command("echo-bench serve", lambda: _serve(args, argv), args.debug)


def _serve(args: argparse.Namespace, argv: list[str] | None) -> int:
    import requests

    try:
        report = run(args)
    except TargetError as e:  # found before any level ran: a server that is not there or not usable
        print(f"echo-bench serve: error: {e}", file=sys.stderr)
        return 2
    except requests.RequestException as e:
        raise CommandError(f"a request failed: {e}") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write(report, out, "echo-bench serve " + " ".join(argv or []))
    print(markdown(report))
    return 0


def write(report: Report, out: Path, command: str) -> list[Path]:
    """``serve.json``, ``serve.md`` and ``requests.jsonl`` into ``out``, and the figures (with
    matplotlib). ``serve.json``'s per-request records leave each request's ITLs to ``requests.jsonl``."""
    from .figures import render

    data = json_ready({"command": command, **asdict(report), "derived": [r.derived() for r in report.runs]})
    for r in data["runs"]:
        r["per_request"] = [{k: v for k, v in q.items() if k != "itl"} for q in r["per_request"]]
    (out / "serve.json").write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    (out / "serve.md").write_text(markdown(report))
    write_requests(report.runs, out / "requests.jsonl")
    figs = render(data, out)
    if figs:
        print("figures: " + ", ".join(str(f) for f in figs))
    return figs
