"""Headless concurrency sweep against a running sglang server: CSVs and one plot per sweep.

    make serve &                                   # sglang on 127.0.0.1:30000
    python loadtests/run.py --users 8,16,32,64,128,256 --level-seconds 60 --level-requests 200
    python loadtests/run.py --smoke                # seconds, not minutes: 2 and 4 users, 8 tokens
    # two servers side by side, each level against both in turn, three passes (side_by_side.py)
    python loadtests/run.py --host none=http://127.0.0.1:30100 --host echo=http://127.0.0.1:30200 \
        --repeats 3 --out out/loadtest/none-vs-echo

Each level runs until ``--level-requests`` requests have finished or ``--level-seconds`` have
passed, whichever comes first. Only localhost is loaded unless ``--allow-remote`` is given.
Writes into ``--out``: ``summary.csv``, ``errors.csv``, ``loadtest.png``, ``run.json`` and, per
level, the request samples, locust's log and locust's own statistics (see README.md). With
several servers or passes each gets such a folder, ``out/[pass<k>/][<name>/]``, and ``--out``
gets ``compare.md`` and ``compare.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

if not __package__:  # run as `python loadtests/run.py`: make the `loadtests` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import requests  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402

from loadtests.compare import median_rows, passes_markdown, plot, read_sweep  # noqa: E402
from loadtests.hosts import RemoteHostRefused, check_host  # noqa: E402
from loadtests.levels import LevelFailed, Sweep, flush_prefix_cache, run_level  # noqa: E402
from loadtests.plot import plot_levels  # noqa: E402
from loadtests.side_by_side import Target, check_targets, parse_target, run_passes, sweeps_for  # noqa: E402
from loadtests.summary import LevelResult, write_csvs  # noqa: E402
from sglang_echo.cli_args import (  # noqa: E402
    Parser,
    alias,
    between,
    count,
    int_list,
    out_dir,
    positive_int,
    run,
)

DEFAULT_HOST = "http://127.0.0.1:30000"
DEFAULT_USERS = "8,16,32,64,128,256"
# --smoke: small enough for CI on a 2-core CPU server, big enough to exercise every code path.
SMOKE = {"users": "2,4", "level_seconds": 60, "level_requests": 8, "max_new_tokens": 8, "warmup_requests": 0}
TAGS = ("chat", "completions", "stream", "nostream")


def _users(text: str) -> tuple[int, ...]:
    return tuple(int_list(1)(text))


def _target(text: str) -> Target:
    try:
        return parse_target(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser() -> Parser:
    p = Parser(prog="loadtests/run.py", description=__doc__)
    p.add_argument(
        "--host",
        dest="hosts",
        action="append",
        type=_target,
        default=None,
        metavar="[NAME=]URL",
        help=f"server base URL (default {DEFAULT_HOST}); give it again, each one named "
        "(none=URL echo=URL), to sweep several servers side by side, the first "
        "being the baseline of the ratios",
    )
    p.add_argument(
        "--repeats",
        type=positive_int,
        default=1,
        help="passes over the levels; each level's order of servers flips from pass to pass",
    )
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a --host that is not localhost (only a server you are responsible for)",
    )
    p.add_argument("--users", type=_users, default=None, help=f"levels (default {DEFAULT_USERS})")
    p.add_argument("--level-seconds", type=positive_int, default=None, help="time limit per level (default 60)")
    p.add_argument("--level-requests", type=positive_int, default=None, help="request limit per level (default 200)")
    p.add_argument("--max-new-tokens", type=positive_int, default=None, help="max_tokens of every request (default 64)")
    p.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-new-tokens per request")
    p.add_argument(
        "--max-new-tokens-jitter",
        type=count,
        default=0,
        help="draw each request's max_tokens from --max-new-tokens +- this, the same lengths in "
        "the same order for every level and server",
    )
    p.add_argument("--tags", nargs="+", choices=TAGS, default=(), help="locust tags to run (default all)")
    p.add_argument(
        "--per-set",
        type=positive_int,
        default=40,
        help="prompts from each dev prompt set (40: all of the hand-written ones)",
    )
    p.add_argument("--keep-cache", action="store_true", help="do not flush sglang's prefix cache before each level")
    p.add_argument(
        "--request-timeout",
        type=between(0.0, float("inf"), low_open=True),
        default=600.0,
        help="seconds without data per request",
    )
    p.add_argument(
        "--drain-seconds",
        type=count,
        default=180,
        help="after the time limit, how long requests in flight may still finish",
    )
    p.add_argument("--out", type=out_dir, default=None, help="output folder (default out/loadtest/<time>)")
    p.add_argument("--smoke", action="store_true", help=f"tiny sweep {SMOKE} that fails on any request error (for CI)")
    p.add_argument("--fail-on-errors", action="store_true", help="exit 1 if any request failed")
    p.add_argument(
        "--warmup-requests",
        type=count,
        default=None,
        help="requests sent 8 at a time before the first level, not measured (default 32, "
        "--smoke 0): a server's first minute is not its throughput (ECHO's cost budget "
        "measures its cost curves there)",
    )
    alias(p, "--max-new-tokens", "--max-tokens", "--max-new")
    alias(p, "--max-new-tokens-jitter", "--max-tokens-jitter", "--max-new-jitter")
    alias(p, "--per-set", "--prompts-per-set")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    args.hosts = args.hosts or [Target("", DEFAULT_HOST)]
    try:
        check_targets(args.hosts)
    except ValueError as exc:
        p.error(str(exc))
    defaults = (
        SMOKE
        if args.smoke
        else {
            "users": DEFAULT_USERS,
            "level_seconds": 60,
            "level_requests": 200,
            "max_new_tokens": 64,
            "warmup_requests": 32,
        }
    )
    for name, value in defaults.items():  # explicit options win over the mode's defaults
        if getattr(args, name) is None:
            setattr(args, name, _users(value) if name == "users" else value)
    args.fail_on_errors = args.fail_on_errors or args.smoke
    if args.out is None:
        args.out = Path("out/loadtest") / time.strftime("%Y%m%d-%H%M%S")
    return args


def served_model(host: str) -> str:
    """The first model the server lists; also the check that a server is there at all."""
    r = requests.get(f"{host}/v1/models", timeout=60)
    r.raise_for_status()
    return r.json()["data"][0]["id"]


def warm_up(host: str, model: str, requests_: int, max_tokens: int, timeout: float) -> int:
    """``requests_`` completions, 8 at a time, whose results are discarded; how many failed."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> bool:
        body = {
            "model": model,
            "prompt": f"Warm-up {i}: write a few sentences about the number {i}.",
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        try:
            return requests.post(f"{host}/v1/completions", json=body, timeout=timeout).ok
        except requests.RequestException:
            return False

    with ThreadPoolExecutor(max_workers=8) as pool:
        return sum(not ok for ok in pool.map(one, range(requests_)))


def sweep_all(
    sweeps: dict[str, list[Sweep]], targets: list[Target], users: tuple[int, ...], console: Console
) -> dict[str, list[list[LevelResult]]]:
    """Every server's levels, pass after pass, each level against every server in turn."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    passes = len(sweeps[targets[0].name])
    with Progress(*columns, console=console) as progress:

        def one_level(target: Target, k: int, n: int) -> LevelResult:
            sweep = sweeps[target.name][k]
            label = " ".join(filter(None, (target.name, f"pass {k + 1}" if passes > 1 else "")))
            if sweep.flush_cache and flush_prefix_cache(sweep.host) is False:
                console.print(
                    f"[yellow]{label} {n} users: the server did not flush its prefix "
                    "cache; this level's TTFT may be optimistic"
                )
            return run_level(sweep, n, progress, label=label)

        return run_passes(targets, passes, users, one_level)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def results_table(results: list[LevelResult], title: str = "") -> Table:
    table = Table(
        "users",
        "req",
        "fail",
        "tok/s",
        "req/s",
        "TTFT p50/95",
        "TPOT p50/95",
        "errors",
        title=f"{title + ': ' if title else ''}ms for TTFT and TPOT; all columns in summary.csv",
    )
    for r in results:
        errors = " ".join(f"{k}={v}" for k, v in r.errors.items()) or "-"
        if r.client_cpu_warning:
            errors += " (locust CPU-bound)"
        table.add_row(
            str(r.users),
            str(r.requests),
            str(r.failures),
            f"{r.tokens_per_s:.1f}",
            f"{r.req_per_s:.2f}",
            f"{_ms(r.ttft_p50_ms)}/{_ms(r.ttft_p95_ms)}",
            f"{_ms(r.tpot_p50_ms)}/{_ms(r.tpot_p95_ms)}",
            errors,
        )
    return table


def connect(hosts: list[Target], allow_remote: bool, console: Console) -> dict[Target, str] | None:
    """Each server (its URL normalised) and the model it serves; None, having said why, if one
    may not be loaded or does not answer."""
    found = {}
    for t in hosts:
        try:
            url = check_host(t.url, allow_remote=allow_remote)
            found[Target(t.name, url)] = served_model(url)
        except RemoteHostRefused as exc:
            console.print(f"[red]{exc}")
            return None
        except (requests.RequestException, ValueError, KeyError, IndexError) as exc:
            console.print(f"[red]no OpenAI-compatible server at {t.url}: {exc}")
            return None
    return found


def write_comparison(sweeps: dict[str, list[Sweep]], targets: list[Target], out: Path, console: Console) -> None:
    """``compare.md`` and ``compare.png`` in ``out``: each pass's ratios and their median."""
    passes = [
        {t.name or "server": read_sweep(sweeps[t.name][k].out) for t in targets}
        for k in range(len(sweeps[targets[0].name]))
    ]
    users = sorted(set.intersection(*(set(rows) for p in passes for rows in p.values())))
    table = passes_markdown(passes, users)
    (out / "compare.md").write_text(table, encoding="utf-8")
    title = f"median of {len(passes)} passes" if len(passes) > 1 else ""
    png = plot(median_rows(passes), users, out / "compare.png", title=title)
    console.print(table + f"wrote {out / 'compare.md'}, {png}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run("loadtests/run.py", lambda: _load_test(args), args.debug)


def _load_test(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    models = connect(args.hosts, args.allow_remote, console)
    if models is None:
        return 2
    targets = list(models)
    base = Sweep(
        host="",
        model="",
        out=args.out,
        level_seconds=args.level_seconds,
        level_requests=args.level_requests,
        max_tokens=args.max_new_tokens,
        ignore_eos=args.ignore_eos,
        max_tokens_jitter=args.max_new_tokens_jitter,
        allow_remote=args.allow_remote,
        tags=tuple(args.tags),
        prompts_per_set=args.per_set,
        request_timeout=args.request_timeout,
        flush_cache=not args.keep_cache,
        drain_seconds=args.drain_seconds,
    )
    sweeps = sweeps_for(base, models, args.repeats, args.out)
    for sweep in (s for per_pass in sweeps.values() for s in per_pass):
        sweep.out.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in asdict(base).items() if k not in ("host", "model")}
    (args.out / "run.json").write_text(
        json.dumps(
            {
                **settings,
                "out": str(args.out),
                "users": list(args.users),
                "repeats": args.repeats,
                "warmup_requests": args.warmup_requests,
                "servers": [{"name": t.name, "host": t.url, "model": m} for t, m in models.items()],
            },
            indent=2,
        )
    )
    for t, model in models.items():
        console.print(
            f"load test: {model} at {t.url}{f' ({t.name})' if t.name else ''}, "
            f"users {list(args.users)}, {args.level_seconds}s / {args.level_requests} "
            f"requests per level, {args.repeats} pass(es) -> {args.out}"
        )
    try:
        for t, model in models.items():
            if args.warmup_requests:
                console.print(f"warm-up {t.name or t.url}: {args.warmup_requests} requests, not measured")
                if failed := warm_up(t.url, model, args.warmup_requests, args.max_new_tokens, args.request_timeout):
                    console.print(f"[yellow]warm-up: {failed} of {args.warmup_requests} requests failed")
        results = sweep_all(sweeps, targets, args.users, console)
    except LevelFailed as exc:
        console.print(f"[red]{exc}")
        return 1
    for t, model in models.items():
        for sweep, levels in zip(sweeps[t.name], results[t.name]):
            summary, errors = write_csvs(levels, sweep.out)
            png = plot_levels(
                levels, sweep.out / "loadtest.png", title=f"{model} @ {t.url}, max_tokens={args.max_new_tokens}"
            )
            console.print(results_table(levels, title=str(sweep.out)))
            console.print(f"wrote {summary}, {errors}, {png}")
    if len(targets) > 1 or args.repeats > 1:
        write_comparison(sweeps, targets, args.out, console)
    if args.fail_on_errors and any(r.failures for per_pass in results.values() for levels in per_pass for r in levels):
        console.print("[red]requests failed (see errors.csv and the per-level logs)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
