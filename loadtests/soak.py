"""Soak a running server: N locust users for T minutes, hostile requests mixed into their traffic.

    make serve &                                   # sglang on 127.0.0.1:30000
    python loadtests/soak.py --users 256 --minutes 10 --hostile-every 20 --out out/soak/echo

The users are ``loadtests/run.py``'s (chat and completions, streaming and not, greedy), all
started at once, for ``--minutes`` plus a drain; before every ``--hostile-every``-th normal
request a user sends the next case of the hostile battery (``loadtests/hostile.py``). A thread
polls ``/health`` all along (``loadtests/health.py``), and the same greedy request is sent
twice before the run and once after it. Writes ``summary.json`` and ``soak.md`` into ``--out``
(with the raw per-request files beside them) and exits 1 if a normal request failed, a hostile
request got a 5xx or no answer, a health poll failed, or the server did not answer the greedy
request after the run (a changed answer is reported, not failed: ``soak_report.py``); 2 on bad
input or when there is no server to soak.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

if not __package__:  # run as `python loadtests/soak.py`: make the `loadtests` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import requests  # noqa: E402
from rich.console import Console  # noqa: E402

from loadtests.health import HealthPoller, Poll  # noqa: E402
from loadtests.hostile import SMOLLM2_VOCAB, ServedModel, battery, read_hostile_samples, write_cases  # noqa: E402
from loadtests.levels import LevelFailed, Sweep, run_level  # noqa: E402
from loadtests.measure import read_samples  # noqa: E402
from loadtests.run import connect  # noqa: E402
from loadtests.side_by_side import Target  # noqa: E402
from loadtests.soak_report import (  # noqa: E402
    GreedyCheck,
    HostileTraffic,
    NormalTraffic,
    SoakReport,
    markdown,
    write_report,
)
from sglang_echo.cli_args import Parser, alias, at_least, between, count, out_dir, positive_int, run  # noqa: E402

DEFAULT_HOST = "http://127.0.0.1:30000"
REFERENCE_PROMPT = "The capital of France is"
REFERENCE_TOKENS = 32
CASES_FILE = "hostile_cases.jsonl"


def parser() -> Parser:
    p = Parser(prog="loadtests/soak.py", description=__doc__)
    p.add_argument("--host", default=DEFAULT_HOST, help="server base URL")
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a --host that is not localhost (only a server you are responsible for)",
    )
    p.add_argument("--users", type=positive_int, default=256, help="concurrent users, all started at once")
    p.add_argument(
        "--minutes",
        type=between(0.0, 24 * 60.0, low_open=True),
        default=10.0,
        help="how long users start new requests (then the drain)",
    )
    p.add_argument(
        "--hostile-every", type=count, default=20, help="one hostile request before every N-th normal one (0: none)"
    )
    p.add_argument("--max-new-tokens", type=positive_int, default=64, help="max_tokens of every normal request")
    p.add_argument(
        "--max-new-tokens-jitter",
        type=count,
        default=0,
        help="draw each request's max_tokens from --max-new-tokens +- this (seeded)",
    )
    p.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-new-tokens per request")
    p.add_argument("--per-set", type=positive_int, default=40, help="prompts from each dev prompt set")
    p.add_argument(
        "--request-timeout",
        type=between(0.0, float("inf"), low_open=True),
        default=600.0,
        help="seconds without data per normal request",
    )
    p.add_argument(
        "--hostile-timeout",
        type=between(0.0, float("inf"), low_open=True),
        default=240.0,
        help="seconds a hostile request may wait for its answer, past which it failed (at most "
        "--drain-seconds; the disconnecting stream waits --request-timeout for its first token)",
    )
    p.add_argument(
        "--drain-seconds", type=count, default=300, help="after --minutes, how long requests in flight may still finish"
    )
    p.add_argument(
        "--health-interval", type=between(0.0, 3600.0, low_open=True), default=5.0, help="seconds between /health polls"
    )
    p.add_argument(
        "--health-timeout",
        type=between(0.0, 3600.0, low_open=True),
        default=30.0,
        help="seconds a /health poll may take (sglang's own check waits up to 20)",
    )
    p.add_argument(
        "--vocab-size",
        type=at_least(1),
        default=None,
        help="the served model's vocabulary, for the out-of-vocabulary cases (default: its "
        f"config.json where the server's model path is readable here, else {SMOLLM2_VOCAB})",
    )
    p.add_argument("--out", type=out_dir, default=None, help="output folder (default out/soak/<time>)")
    alias(p, "--max-new-tokens", "--max-tokens")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.hostile_every and args.hostile_timeout > args.drain_seconds:
        # Locust stops whatever still runs when the drain ends: such a request would leave no record.
        p.error(
            f"--hostile-timeout ({args.hostile_timeout:g} s) must not exceed --drain-seconds "
            f"({args.drain_seconds} s): a hostile request still waiting when the drain ends goes unrecorded"
        )
    if args.out is None:
        args.out = Path("out/soak") / time.strftime("%Y%m%d-%H%M%S")
    return args


def served_model(host: str, name: str, vocab_size: int | None) -> tuple[ServedModel, list[str]]:
    """The model the hostile bodies are written for, and notes on where its figures came from:
    the context length from ``/v1/models`` (sglang's ``max_model_len``), the vocabulary from the
    model's ``config.json`` where the path sglang's ``/model_info`` gives is readable here."""
    notes = []
    card = requests.get(f"{host}/v1/models", timeout=60).json()["data"][0]
    context = card.get("max_model_len")
    if not isinstance(context, int):
        context = ServedModel(name).context_len
        notes.append(f"the server does not say its context length; the battery assumes {context}")
    if vocab_size is None:
        vocab_size = _config_vocab(host)
    if vocab_size is None:
        vocab_size = SMOLLM2_VOCAB
        notes.append(
            f"the model's config.json is not readable here; the battery assumes SmolLM2's vocabulary "
            f"({SMOLLM2_VOCAB}); --vocab-size sets it"
        )
    return ServedModel(name, vocab_size, context), notes


def _config_vocab(host: str) -> int | None:
    try:
        r = requests.get(f"{host}/model_info", timeout=60)
        config = Path(r.json()["model_path"]) / "config.json"
        vocab = json.loads(config.read_text(encoding="utf-8")).get("vocab_size")
    except (requests.RequestException, ValueError, KeyError, TypeError, OSError):
        return None
    return vocab if isinstance(vocab, int) and vocab > 0 else None


def greedy_answer(host: str, model: str, timeout: float) -> str | None:
    """The text of :data:`REFERENCE_PROMPT`'s greedy completion; None if the server gave none."""
    body = {"model": model, "prompt": REFERENCE_PROMPT, "max_tokens": REFERENCE_TOKENS, "temperature": 0}
    try:
        r = requests.post(f"{host}/v1/completions", json=body, timeout=timeout)
        return r.json()["choices"][0]["text"] if r.status_code == 200 else None
    except (requests.RequestException, ValueError, KeyError, IndexError, TypeError):
        return None


def _machine() -> dict:
    from sglang_echo.bench.machine import describe  # imports torch: only once the run is over

    return describe()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = shlex.join(["python", "loadtests/soak.py", *(sys.argv[1:] if argv is None else argv)])
    return run("loadtests/soak.py", lambda: _soak(args, command), args.debug)


def _health_line(console: Console, started: float):
    def say(poll: Poll) -> None:
        at = poll.start - started
        if poll.ok:
            console.print(f"health: ok at {at:.0f}s" if at > 1 else "health: ok")
        else:
            console.print(f"[red]health: FAILED at {at:.0f}s (status {poll.status or 'none'})")

    return say


def _soak(args: argparse.Namespace, command: str) -> int:
    console = Console(stderr=True)
    found = connect([Target("", args.host)], args.allow_remote, console)
    if found is None:
        return 2
    ((target, name),) = found.items()
    model, notes = served_model(target.url, name, args.vocab_size)
    args.out.mkdir(parents=True, exist_ok=True)
    cases = battery(model)
    # Twice: a server that answers the same greedy request differently when idle is not one whose
    # answer after the run can be judged by comparison.
    before = [greedy_answer(target.url, name, args.request_timeout) for _ in range(2)]
    if None in before:
        console.print(f"[red]{target.url} did not answer the greedy reference request; not soaking it")
        return 1
    seconds = max(1, round(args.minutes * 60))
    sweep = Sweep(
        host=target.url,
        model=name,
        out=args.out,
        level_seconds=seconds,
        level_requests=0,
        max_tokens=args.max_new_tokens,
        ignore_eos=args.ignore_eos,
        max_tokens_jitter=args.max_new_tokens_jitter,
        allow_remote=args.allow_remote,
        prompts_per_set=args.per_set,
        request_timeout=args.request_timeout,
        flush_cache=False,
        drain_seconds=args.drain_seconds,
        hostile_every=args.hostile_every,
        hostile_cases=write_cases(cases, args.out / CASES_FILE),
        hostile_timeout=args.hostile_timeout,
    )
    hostile = (
        f"{len(cases)} hostile cases, one per {args.hostile_every} normal requests"
        if args.hostile_every
        else "no hostile requests"
    )
    console.print(
        f"soak: {name} at {target.url}, {args.users} users for {seconds}s (+ up to "
        f"{args.drain_seconds}s of drain), {hostile} -> {args.out}"
    )
    started = time.time()
    poller = HealthPoller(target.url, args.health_interval, args.health_timeout)
    poller.on_change = _health_line(console, started)
    poller.start()
    try:
        level = run_level(sweep, args.users)
    except LevelFailed as exc:
        poller.stop()
        console.print(f"[red]{exc}")
        return 1
    health = poller.stop()
    duration = time.time() - started
    after = greedy_answer(target.url, name, args.request_timeout)
    files = sweep.files(args.users)
    report = SoakReport(
        command=command,
        machine=_machine(),
        host=target.url,
        model=model,
        users=args.users,
        seconds=seconds,
        settings={
            "max_tokens": args.max_new_tokens,
            "max_tokens_jitter": args.max_new_tokens_jitter,
            "ignore_eos": args.ignore_eos,
            "drain_seconds": args.drain_seconds,
            "request_timeout_s": args.request_timeout,
            "hostile_timeout_s": args.hostile_timeout,
        },
        started=started,
        duration_s=duration,
        normal=NormalTraffic.of(level, read_samples(files.samples)),
        hostile=HostileTraffic.of(args.hostile_every, cases, read_hostile_samples(files.hostile_samples)),
        health=health,
        greedy=GreedyCheck(REFERENCE_PROMPT, REFERENCE_TOKENS, *before, after),
        notes=notes,
    )
    summary, md = write_report(report, args.out)
    print(markdown(report))  # the result, on stdout; as written (no console markup or wrapping)
    console.print(f"wrote {summary}, {md}")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
