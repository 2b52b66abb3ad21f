"""`echo-bench serve`: tokens/s and accepted length of real sglang servers, side by side.

Every configuration serves the same prompts with the same target, dtype, draft head and
concurrency levels, in one run, so the printed ratios compare like with like. Greedy outputs of
every speculative configuration are checked token for token against no speculation.

    echo-bench serve --configs none,ngram,eagle3,echo --concurrency 1,8,32 --max-new 64
    echo-bench serve --configs none,eagle3,echo,echo-dart,echo-ngram   # drafters side by side
    echo-bench serve --configs none,echo,echo-dense,echo-fixed --calibration C.json   # Sec. 5.3 ablation

Writes ``<out>/serve.json`` (machine, settings, per-run figures, per-request records) and
``<out>/serve.md``, and with matplotlib ``throughput.png`` (ECHO Fig. 5's shape),
``utilisation.png`` (Fig. 4) and ``budget.png`` (:mod:`.figures`; ``echo-bench figures DIR``
redraws them from a ``serve.json``). Besides tokens/s and MAT every run reports:

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
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

from ..integration.config import DRAFTERS
from ..models.prompts import load_mixed
from ..platform import step_times
from ..serve.client import Generation, generate
from ..serve.flags import ServerOptions
from ..serve.server import SGLangServer
from .level_metrics import echo_deltas, scrape_echo_metrics, settled_step_times
from .machine import describe
from .serve_configs import CONFIGS, calibration_dir, echo_env
from .serve_tables import markdown, quartiles

@dataclass
class Run:
    config: str
    concurrency: int
    requests: int
    seconds: float
    completion_tokens: int
    verify_steps: int
    lossless: bool | None = None
    startup_seconds: float | None = None
    nominal_depth: int | None = None  # static trees' depth (EAGLE-3 num_steps); None: per request
    per_request: list[dict] = field(default_factory=list)  # request_record() of every request
    echo: dict | None = None  # echo_deltas() of the level (ECHO servers with metrics)
    repeat: int = 0  # which pass over the configs (--repeats): speedups compare runs of one pass
    server_cpu_s: float | None = None  # CPU seconds the server's processes used during the level
    step_times: dict | None = None  # step_times.delta() of the level (CPU-platform servers)
    nominal_tokens: int | None = None  # static trees' verified tokens per request and step (num_draft_tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds

    @property
    def cpu_ms_per_token(self) -> float | None:
        """Server CPU milliseconds per generated token: the work a token costs, which other load
        on a shared host does not change the way it changes wall-clock rates."""
        if self.server_cpu_s is None or not self.completion_tokens:
            return None
        return 1000 * self.server_cpu_s / self.completion_tokens

    @property
    def mat(self) -> float | None:
        """Tokens committed per verify step per request (sglang's accept length incl. bonus)."""
        return self.completion_tokens / self.verify_steps if self.verify_steps else None

    @property
    def draft_yield(self) -> float | None:
        """ECHO Eq. 3's yield, the share of drafted tokens the target accepted. ECHO servers count
        verified and accepted tokens, less one root and one bonus token per request and step (a
        request's verify steps); a static tree drafts ``num_draft_tokens - 1`` per request and
        step, and every token but a request's first (its prefill's) and each step's bonus was an
        accepted draft. None without drafts."""
        e = self.echo or {}
        if e.get("verified_tokens") is not None and e.get("accepted_tokens") is not None:
            drafted, accepted = e["verified_tokens"] - self.verify_steps, e["accepted_tokens"] - self.verify_steps
        elif self.nominal_tokens and self.verify_steps:
            drafted = self.verify_steps * (self.nominal_tokens - 1)
            accepted = self.completion_tokens - self.requests - self.verify_steps
        else:
            return None
        return accepted / drafted if drafted > 0 else None

    @property
    def utilisation(self) -> dict | None:
        """Quartiles of the per-request u (None without any)."""
        return quartiles([r["u"] for r in self.per_request if r.get("u") is not None])

    def derived(self) -> dict:
        u = self.utilisation or {}
        e = self.echo or {}
        return {"config": self.config, "concurrency": self.concurrency, "tokens_per_s": self.tokens_per_s,
                "mat": self.mat, "yield": self.draft_yield, "u_median": u.get("median"), "u_q1": u.get("q1"), "u_q3": u.get("q3"),
                "verified_per_step": e.get("verified_per_step"), "k_max": e.get("k_max"),
                "control_share": e.get("control_share"), "cpu_ms_per_token": self.cpu_ms_per_token}


@dataclass
class Report:
    machine: dict
    settings: dict
    runs: list[Run] = field(default_factory=list)


def report_from_json(data: dict) -> Report:
    """A :class:`Report` back from ``serve.json`` (older files lack the newer fields: defaults)."""
    names = set(Run.__dataclass_fields__)
    runs = [Run(**{k: v for k, v in r.items() if k in names}) for r in data.get("runs", [])]
    return Report(data.get("machine", {}), data.get("settings", {}), runs)


# -- per request: MAT, depth, utilisation -------------------------------------------------------
def request_record(meta: dict, output_ids: list[int], nominal_depth: int | None = None,
                   dataset: str | None = None, seconds: float | None = None) -> dict:
    """One request's figures from sglang's ``meta_info``.

    MAT = completion_tokens / spec_verify_ct (sglang's ``spec_accept_length``: bonus token
    included). Depth = ``sum(meta_info["echo_tree_depth"]) / spec_verify_ct`` where the ECHO
    worker reports it (the mean depth of the request's trees, 0 for a root-only step), else
    ``nominal_depth``. u = MAT / depth over the steps that drafted for the request (None without
    any): a root-only step commits one token and has no draft to use, so ECHO's u counts the
    tokens its drafting steps committed over their summed depth, ``(tokens - 1 - root-only
    steps) / depth_sum`` (the first token is the prefill's). As MAT counts the bonus token, u can
    exceed 1 for shallow trees. ``u_drafts`` = accepted draft tokens / drafted depth
    (``spec_num_correct_drafts / depth_sum``) leaves it out.
    """
    tokens = int(meta.get("completion_tokens", len(output_ids)))
    steps = int(meta.get("spec_verify_ct", 0) or 0)
    mat = tokens / steps if steps else None
    depths = meta.get("echo_tree_depth")
    depth_sum = None
    if isinstance(depths, list):
        depth_sum = sum(int(d) for d in depths if d is not None)
        depth = depth_sum / steps if steps else None
        # one entry per output token, a step's depth on the first token it commits: nonzero once per drafting step
        root_only_steps = steps - sum(1 for d in depths if d)
        u = (tokens - 1 - root_only_steps) / depth_sum if steps and depth_sum else None
    else:
        depth = float(nominal_depth) if nominal_depth else None
        u = mat / depth if mat is not None and depth else None
    correct = meta.get("spec_num_correct_drafts")
    u_drafts = correct / (depth * steps) if correct is not None and depth and steps else None
    rec = {"tokens": tokens, "verify_ct": steps, "mat": mat, "depth": depth, "u": u, "u_drafts": u_drafts,
           "k_mean": meta.get("spec_cap_length")}
    if depth_sum is not None:
        rec["depth_sum"] = depth_sum
    if dataset is not None:
        rec["dataset"] = dataset
    if seconds is not None:
        rec["seconds"] = seconds
    return rec


def max_new_tokens(max_new: int, jitter: int, n: int) -> list[int]:
    """Each request's token budget: ``max_new``, or with ``jitter`` spread over ``max_new +- jitter``
    by a fixed pattern (the same in every config and pass). Equal budgets keep the requests of a
    closed-loop wave in step under plain decoding, finishing together and prefilling their successors
    in one batch, while speculation, committing unevenly, splits them into several prefills."""
    if jitter <= 0:
        return [max_new] * n
    return [max(1, max_new - jitter + (i * 37) % (2 * jitter + 1)) for i in range(n)]


WARMUP_CONCURRENCY = 8


def warmup_level(pool: list[str], requests: int, max_new: int) -> tuple[list[str], int, list[int]]:
    """The unmeasured level each server serves before its first (``_one_level``'s texts,
    concurrency, max new tokens): first-request costs, and ``budget: cost``'s warm-up (its first
    16 drafting steps, at K_max) are start-up, not throughput. At 8 requests a batch has room to
    draft, so the warm-up ends here rather than inside a measured level."""
    n = max(requests, 1)
    return (pool * (1 + n // len(pool)))[:n], min(WARMUP_CONCURRENCY, n), [max_new] * n


def _one_level(url: str, texts: list[str], concurrency: int, max_new: Sequence[int]
               ) -> tuple[float, list[Generation], list[float]]:
    """Send ``texts`` (``max_new[i]`` tokens each) with ``concurrency`` clients; wall seconds,
    the generations, each latency."""

    def ask(text: str, budget: int) -> tuple[Generation, float]:
        t = time.perf_counter()
        g = generate(url, text=text, max_new_tokens=budget, temperature=0.0)
        return g, time.perf_counter() - t

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        outs = list(pool.map(ask, texts, max_new))
    return time.perf_counter() - t0, [g for g, _ in outs], [s for _, s in outs]


def run(args: argparse.Namespace) -> Report:
    from transformers import AutoTokenizer

    from ..calibration.shipped import shipped_calibration
    from ..models.drafts import shipped_head
    from ..models.prepare import prepare

    model = prepare(dtype=args.dtype).path
    given = {"eagle3": args.draft, "dart": args.dart_draft, "dflash": args.dflash_draft}
    drafters = {"eagle3"} | {CONFIGS[c][2].get("SGLANG_ECHO_DRAFTER", args.echo_drafter)
                             for c in args.configs.split(",") if CONFIGS[c][0] == "echo"} - {"ngram"}
    heads = {d: Path(given[d]) if given[d] else shipped_head(model, d) for d in sorted(drafters)}
    draft = heads["eagle3"]
    calib_dir = calibration_dir(args)
    pick = None if calib_dir is None else lambda drafter: shipped_calibration(model, drafter, heads.get(drafter), calib_dir)
    tokenizer = AutoTokenizer.from_pretrained(model)
    levels = [int(c) for c in args.concurrency.split(",")]
    prompts_all = load_mixed(args.per_set)
    pool = [p.as_text(tokenizer) for p in prompts_all]
    datasets = [p.dataset for p in prompts_all]
    report = Report(
        machine={**describe(), "cpus": os.cpu_count()},
        settings={"model": str(model), "draft": str(draft), "heads": {d: str(h) for d, h in heads.items()},
                  "dtype": args.dtype, "max_new": args.max_new, "max_new_jitter": args.max_new_jitter,
                  "concurrency": levels, "prompts": len(pool), "per_set": args.per_set,
                  "echo_drafter": args.echo_drafter, "calibration": args.calibration,
                  "warmup_requests": args.warmup_requests,
                  "max_total_tokens": args.max_total_tokens},
    )
    bench = _Bench(args, model, heads, pick, levels, pool, datasets)
    names = args.configs.split(",")
    if args.interleave:
        report.runs += _interleaved(bench, names)
        return report
    for rep in range(args.repeats):
        for name in _in_order(names, rep):
            with _Server(bench, name, args.port) as srv:
                report.runs += [srv.measure(c, rep) for c in levels]
    return report


def _in_order(names: list[str], rep: int) -> list[str]:
    """Pass ``rep``'s order: alternating, so that a drifting machine (shared VMs drift 10-30% over
    minutes) favours no config."""
    return names if rep % 2 == 0 else names[::-1]


def _interleaved(bench: "_Bench", names: list[str]) -> list[Run]:
    """Every config's server up at once (idle ones sleep), and each level of each pass run for
    every config back to back: what drifts in between is one level's minutes, not a whole pass's."""
    runs = []
    with ExitStack() as stack:
        servers = {name: stack.enter_context(_Server(bench, name, bench.args.port + 10 * i))
                   for i, name in enumerate(names)}
        for rep in range(bench.args.repeats):
            for c in bench.levels:
                runs += [servers[name].measure(c, rep) for name in _in_order(names, rep)]
    return runs


@dataclass
class _Bench:
    """What every config's server is measured with."""

    args: argparse.Namespace
    model: Path
    heads: dict[str, Path]
    pick: Optional[Callable[[str], Optional[Path]]]
    levels: list[int]
    pool: list[str]  # prompt texts
    datasets: list[str]  # each prompt's set
    reference: dict[int, list[list[int]]] = field(default_factory=dict)  # none's output ids per level


class _Server:
    """One config's server (a context manager), measured a level at a time."""

    def __init__(self, bench: _Bench, name: str, port: int) -> None:
        self.bench, self.name = bench, name
        args = bench.args
        self.spec, knobs, _ = CONFIGS[name]
        env = echo_env(name, args, bench.pick)
        head = bench.heads.get(env.get("SGLANG_ECHO_DRAFTER", "eagle3")) if self.spec in ("eagle3", "echo") else None
        if self.spec == "echo":
            print(f"[echo-bench] {name}: drafter {env['SGLANG_ECHO_DRAFTER']}, "
                  f"calibration {env.get('SGLANG_ECHO_CALIBRATION', 'none (paper gates)')}", flush=True)
        self.opts = ServerOptions(model_path=bench.model, port=port, spec=self.spec, draft_path=head,
                                  spec_options=knobs, dtype=args.dtype, max_running_requests=max(bench.levels),
                                  max_total_tokens=args.max_total_tokens, enable_metrics=True,
                                  extra_env=tuple({step_times.ENV: "1", **env}.items()))
        self.static_shape = knobs if self.spec == "eagle3" else None  # sglang's static tree: depth, tokens known
        self.srv: Optional[SGLangServer] = None

    def __enter__(self) -> "_Server":
        self.srv = SGLangServer(self.opts).__enter__()
        try:
            _one_level(self.srv.base_url, *warmup_level(self.bench.pool, self.bench.args.warmup_requests,
                                                        self.bench.args.max_new))
        except BaseException:
            self.srv.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.srv.stop()

    def measure(self, c: int, rep: int) -> Run:
        """One concurrency level: :func:`level_requests` requests, ``c`` at a time."""
        bench, name, url = self.bench, self.name, self.srv.base_url
        n = level_requests(c, bench.args.rounds, bench.args.min_requests)
        prompts = (bench.pool * (1 + n // len(bench.pool)))[:n]
        sets = (bench.datasets * (1 + n // len(bench.datasets)))[:n]
        echo = self.spec == "echo"
        before = scrape_echo_metrics(url) if echo else {}
        steps_before = settled_step_times(self.srv)
        budgets = max_new_tokens(bench.args.max_new, bench.args.max_new_jitter, n)
        cpu0 = self.srv.cpu_seconds()
        seconds, outs, latencies = _one_level(url, prompts, c, budgets)
        cpu_s = self.srv.cpu_seconds() - cpu0
        after = scrape_echo_metrics(url) if echo else {}
        level_steps = None if steps_before is None else step_times.delta(steps_before, settled_step_times(self.srv))
        ids = [o.output_ids for o in outs]
        steps = sum(int(o.meta.get("spec_verify_ct", 0)) for o in outs)
        # None: this is the reference, or the run has no `none` to compare with (yet)
        lossless = None if name == "none" or c not in bench.reference else ids == bench.reference[c]
        if name == "none":
            bench.reference.setdefault(c, ids)
        shape = self.static_shape
        depth, tokens = (shape.num_steps, shape.num_draft_tokens) if shape else (None, None)
        per_request = [request_record(o.meta, o.output_ids, depth, ds, lat)
                       for o, ds, lat in zip(outs, sets, latencies)]
        r = Run(name, c, len(prompts), seconds, sum(len(i) for i in ids), steps, lossless, self.srv.startup_seconds,
                depth, per_request, echo_deltas(before, after), rep, cpu_s, level_steps, tokens)
        print(_progress(r), flush=True)
        return r


def level_requests(concurrency: int, rounds: int, min_requests: int = 0) -> int:
    """Requests in one level: ``concurrency x rounds``, at least ``concurrency`` and ``min_requests``
    (so that a sweep of 1 to 256 gives its low levels more than one round of requests without
    giving its high levels many)."""
    return max(concurrency * rounds, concurrency, min_requests)


def _progress(r: Run) -> str:
    mat = f"{r.mat:.2f}" if r.mat else "-"
    line = f"{r.config:>10} c={r.concurrency:<3} {r.tokens_per_s:7.2f} tok/s  MAT {mat:>5}  lossless {r.lossless}"
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="echo-bench serve", description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="none,ngram,eagle3,echo", help=f"comma list of {','.join(CONFIGS)}")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=1, help="requests per level = concurrency x rounds")
    ap.add_argument("--min-requests", type=int, default=0,
                    help="at least this many requests per level (low concurrencies in a sweep up to 256)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="passes over the configs, alternating their order; speedups compare runs of one pass")
    ap.add_argument("--interleave", action="store_true",
                    help="start every config's server at once and run each level of each pass config after config "
                         "(ports --port, --port+10, ...): ratios then span one level's minutes, not a whole pass")
    ap.add_argument("--per-set", type=int, default=10, help="prompts taken from each prompt set")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--max-new-jitter", type=int, default=0,
                    help="spread each request's max new tokens over max-new +- this (a fixed pattern), so that "
                         "plain decoding's requests do not finish in step")
    ap.add_argument("--warmup-requests", type=int, default=16,
                    help=f"requests each server serves unmeasured before its first level, {WARMUP_CONCURRENCY} at a "
                         "time, --max-new tokens each (at least 1)")
    ap.add_argument("--dtype", default="float32", help="float32 keeps the token-for-token check exact")
    ap.add_argument("--max-total-tokens", type=int, default=None,
                    help="every server's KV pool in tokens (default: make serve's: on CPUs 16,384, plus the draft "
                         "slots a speculative server holds per running request)")
    ap.add_argument("--draft", default=None, help="EAGLE-3 head (default: the shipped head)")
    ap.add_argument("--echo-drafter", choices=DRAFTERS, default="eagle3",
                    help="the drafter of the echo* configs (echo-dart and echo-ngram pin theirs)")
    ap.add_argument("--dart-draft", default=None, help="DART head for the dart drafter (default: the shipped one)")
    ap.add_argument("--dflash-draft", default=None, help="DFlash head for the dflash drafter (default: the shipped one)")
    ap.add_argument("--calibration", default=None, help="echo-calibrate output for the echo* configs, or a folder of them / 'shipped' (each "
                    "config takes the file made for its drafter; default: paper gates)")
    ap.add_argument("--port", type=int, default=30400)
    ap.add_argument("--out", default="benchmarks/results/cpu")
    args = ap.parse_args(argv)
    report = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write(report, out, "echo-bench serve " + " ".join(argv or []))
    print(markdown(report))


def write(report: Report, out: Path, command: str) -> list[Path]:
    """``serve.json`` and ``serve.md`` into ``out``, and the figures (with matplotlib)."""
    from .figures import render

    data = {"command": command, **asdict(report), "derived": [r.derived() for r in report.runs]}
    (out / "serve.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / "serve.md").write_text(markdown(report))
    figs = render(data, out)
    if figs:
        print("figures: " + ", ".join(str(f) for f in figs))
    return figs
