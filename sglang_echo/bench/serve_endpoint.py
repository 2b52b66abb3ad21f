"""One config's server as `echo-bench serve` measures it (:class:`Endpoint`): started by the bench
(:class:`StartedServer`) or already running (``--base-url``, :func:`running_server`), and one level
of load on it (:func:`measure`) -> a :class:`Run`.

What is measured depends on what the server tells: tokens/s, request throughput and latency from
every server; MAT from servers that report verify steps (sglang's native API); ECHO's counters
where ``/metrics`` exports them (started ECHO servers, and any ``--base-url`` server whose
``/metrics`` answers); server CPU seconds and scheduler step times only from servers the bench
started (its own processes and log). The lossless check compares each config's greedy outputs at a
level with ``none``'s (ids from sglang's API, text from an OpenAI one).
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..platform import step_times
from ..serve.flags import ServerOptions, SpecOptions
from ..serve.server import SGLangServer
from .arrivals import poisson_arrivals
from .latency import latency_summary
from .level_metrics import echo_deltas, scrape_echo_metrics, settled_step_times
from .load import Level, run_level
from .requester import Outcome, same_outputs, send
from .serve_args import WARMUP_CONCURRENCY
from .serve_configs import CONFIGS, echo_env
from .serve_run import Run, request_record
from .targets import Target
from .workload import PromptItem, cycle


@dataclass
class Bench:
    """What every config's server is measured with."""

    args: argparse.Namespace
    model: Optional[Path]  # the target started servers load (None: --base-url)
    heads: dict[str, Path]
    pick: Optional[Callable[[str], Optional[Path]]]
    levels: list[Level]
    items: list[PromptItem]
    reference: dict[float, list[Outcome]] = field(default_factory=dict)  # none's outcomes per level

    def requests_in(self, level: Level) -> int:
        """Closed loop: :func:`level_requests`; open loop: ``--num-requests`` or the pool's size."""
        a = self.args
        if level.rate is None:
            return level_requests(level.concurrency, a.rounds, a.min_requests)
        return a.num_requests or len(self.items)


@dataclass
class Endpoint:
    """A server under test: its target (name, URL, API), and for one the bench started, its spec,
    static tree shape (sglang's EAGLE-3: depth and tokens known) and process."""

    target: Target
    spec: str | None = None
    static_shape: SpecOptions | None = None
    server: SGLangServer | None = None

    @property
    def name(self) -> str:
        return self.target.name

    @property
    def scrape(self) -> bool:
        """Read ``/metrics`` around each level: ECHO servers the bench started, any server it did not."""
        return self.server is None or self.spec == "echo"


def max_new_tokens(max_new: int, jitter: int, n: int) -> list[int]:
    """Each request's token budget: ``max_new``, or with ``jitter`` spread over ``max_new +- jitter``
    by a fixed pattern (the same in every config and pass). Equal budgets keep the requests of a
    closed-loop wave in step under plain decoding, finishing together and prefilling their successors
    in one batch, while speculation, committing unevenly, splits them into several prefills."""
    if jitter <= 0:
        return [max_new] * n
    return [max(1, max_new - jitter + (i * 37) % (2 * jitter + 1)) for i in range(n)]


def level_requests(concurrency: int, rounds: int, min_requests: int = 0) -> int:
    """Requests in one level: ``concurrency x rounds``, at least ``concurrency`` and ``min_requests``
    (so that a sweep of 1 to 256 gives its low levels more than one round of requests without
    giving its high levels many)."""
    return max(concurrency * rounds, concurrency, min_requests)


def warmup_level(pool: Sequence, requests: int, max_new: int) -> tuple[list, int, list[int]]:
    """The unmeasured level each server serves before its first (prompts, concurrency, max new
    tokens): first-request costs, and ``budget: cost``'s warm-up (its first 16 drafting steps, at
    K_max) are start-up, not throughput. At 8 requests a batch has room to draft, so the warm-up
    ends here rather than inside a measured level."""
    n = max(requests, 1)
    return cycle(list(pool), n), min(WARMUP_CONCURRENCY, n), [max_new] * n


def warm_up(bench: Bench, ep: Endpoint) -> None:
    items, concurrency, budgets = warmup_level(bench.items, bench.args.warmup_requests, bench.args.max_new_tokens)
    run_level(
        lambda i: send(ep.target, items[i], budgets[i], stream=False, ignore_eos=bench.args.ignore_eos),
        len(items),
        concurrency,
    )


class StartedServer:
    """One config's server started by the bench (a context manager yielding its :class:`Endpoint`
    once healthy; :func:`warm_up` it before measuring)."""

    def __init__(self, bench: Bench, name: str, port: int) -> None:
        self.bench, self.name = bench, name
        args = bench.args
        self.spec, knobs, _ = CONFIGS[name]
        env = {**echo_env(name, args, bench.pick), **simulation_env(self.spec, args.sim)}
        head = bench.heads.get(env.get("SGLANG_ECHO_DRAFTER", "eagle3")) if self.spec in ("eagle3", "echo") else None
        if self.spec == "echo":
            print(
                f"[echo-bench] {name}: drafter {env['SGLANG_ECHO_DRAFTER']}, "
                f"calibration {env.get('SGLANG_ECHO_CALIBRATION', 'none (paper gates)')}",
                flush=True,
            )
        self.opts = ServerOptions(
            model_path=bench.model,
            port=port,
            spec=self.spec,
            draft_path=head,
            spec_options=knobs,
            dtype=args.dtype,
            max_running_requests=max_in_flight(bench),
            max_total_tokens=args.max_total_tokens,
            enable_metrics=True,
            extra_env=tuple({step_times.ENV: "1", **env}.items()),
            device=args.device,
            load_format=args.load_format,
            skip_tokenizer_init=args.token_shape is not None or args.sim is not None,
            attention_backend=args.attention_backend,
            extra_args=tuple(shlex.split(args.server_args)),
        )
        self.static_shape = knobs if self.spec == "eagle3" else None  # sglang's static tree: depth, tokens known
        self.srv: Optional[SGLangServer] = None

    def launch(self) -> None:
        """Start the server's process without waiting for it. Call it from a thread that outlives
        the server (the main thread): the process gets SIGTERM when the thread that started it ends
        (:func:`~sglang_echo.serve.server.die_with_parent`), so :meth:`__enter__` may then run in a
        short-lived worker thread."""
        self.srv = SGLangServer(self.opts)
        self.srv.start()

    def __enter__(self) -> Endpoint:
        if self.srv is None:
            self.launch()
        ep = Endpoint(Target(self.name, self.srv.base_url), self.spec, self.static_shape, self.srv)
        try:
            self.srv.wait_healthy()
        except BaseException:
            self.srv.stop()
            raise
        return ep

    def __exit__(self, *exc) -> None:
        self.srv.stop()


def simulation_env(spec: str, sim: Optional[dict]) -> dict[str, str]:
    """The environment that makes a started server simulate acceptance from ``--simulate``'s trace:
    ECHO drafts the trace's candidates and follows its tokens; sglang's EAGLE3 accepts the trace's
    mean length per step along its first chain; plain decoding is left alone."""
    if sim is None:
        return {}
    if spec == "echo":
        return {"SGLANG_ECHO_SIMULATE": sim["stem"]}
    if spec == "eagle3":
        return dict(sim["env"]["eagle3"])
    return {}


def max_in_flight(bench: Bench) -> int:
    """The most requests a level has in flight: what a started server must admit at once."""
    return max(level.concurrency for level in bench.levels)


@contextlib.contextmanager
def running_server(bench: Bench, target: Target) -> Iterator[Endpoint]:
    """A ``--base-url`` server as an :class:`Endpoint` (:func:`warm_up` it before measuring)."""
    yield Endpoint(target)


def measure(bench: Bench, ep: Endpoint, level: Level, rep: int) -> Run:
    """One level of pass ``rep`` on ``ep``: :meth:`Bench.requests_in` requests, closed loop or
    Poisson arrivals (seeded by ``--seed``: every config and pass meets the same schedule)."""
    args, srv = bench.args, ep.server
    n = bench.requests_in(level)
    items = cycle(bench.items, n)
    budgets = max_new_tokens(args.max_new_tokens, args.max_new_tokens_jitter, n)
    arrivals = None if level.rate is None else poisson_arrivals(n, level.rate, args.seed)
    before = scrape_echo_metrics(ep.target.url) if ep.scrape else {}
    steps_before = settled_step_times(srv) if srv else None
    cpu0 = srv.cpu_seconds() if srv else 0.0
    seconds, outs = run_level(
        lambda i: send(ep.target, items[i], budgets[i], args.stream, args.ignore_eos), n, level.concurrency, arrivals
    )
    cpu_s = srv.cpu_seconds() - cpu0 if srv else None
    after = scrape_echo_metrics(ep.target.url) if ep.scrape else {}
    level_steps = None if steps_before is None else step_times.delta(steps_before, settled_step_times(srv))
    # None: this is the reference, or the run has no `none` to compare with (yet)
    ref = None if ep.name == "none" else bench.reference.get(level.key)
    lossless = None if ref is None else same_outputs(outs, ref)
    if ep.name == "none":
        bench.reference.setdefault(level.key, outs)
    depth, tokens = (ep.static_shape.num_steps, ep.static_shape.num_draft_tokens) if ep.static_shape else (None, None)
    per_request = [_record(o, item, depth) for o, item in zip(outs, items)]
    steps = sum(int(o.meta.get("spec_verify_ct", 0) or 0) for o in outs)
    return Run(
        ep.name,
        level.concurrency,
        n,
        seconds,
        sum(o.completion_tokens for o in outs),
        steps,
        lossless,
        srv.startup_seconds if srv else None,
        depth,
        per_request,
        echo_deltas(before, after),
        rep,
        cpu_s,
        level_steps,
        tokens,
        level.rate,
        latency_summary(per_request, seconds),
    )


def _record(o: Outcome, item: PromptItem, nominal_depth: int | None) -> dict:
    """:func:`request_record` with the prompt (id, tokens) and the request's TTFT and ITLs."""
    rec = request_record(o.meta, o.output_ids, nominal_depth, item.dataset, o.latency)
    prompt_tokens = o.meta.get("prompt_tokens", item.prompt_tokens)
    return {**rec, "prompt_id": item.id, "prompt_tokens": prompt_tokens, "ttft": o.ttft, "itl": o.itl}
