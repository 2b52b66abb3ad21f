"""`echo-bench serve`: tokens/s and accepted length of real sglang servers, side by side.

Every configuration serves the same prompts with the same target, dtype, draft head and
concurrency levels, in one run, so the printed ratios compare like with like. Greedy outputs of
every speculative configuration are checked token for token against no speculation.

    echo-bench serve --configs none,ngram,eagle3,echo --concurrency 1,8,32 --max-new 64
    echo-bench serve --configs none,echo,echo-dense,echo-fixed --calibration C.json   # Sec. 5.3 ablation

Writes ``<out>/serve.json`` (machine, settings, per-run figures) and ``<out>/serve.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..models.prompts import load_mixed
from ..serve.client import Generation, generate
from ..serve.flags import ServerOptions, SpecOptions
from ..serve.server import SGLangServer

# name -> (spec, speculative knobs, extra environment). EAGLE-3's static tree uses the paper's
# streamlined high-concurrency shape (depth 3, top-k 3, 5 tokens); ECHO its own defaults.
CONFIGS: dict[str, tuple[str, SpecOptions, dict[str, str]]] = {
    "none": ("none", SpecOptions(), {}),
    "ngram": ("ngram", SpecOptions(num_draft_tokens=8), {}),
    "eagle3": ("eagle3", SpecOptions(num_steps=3, eagle_topk=3, num_draft_tokens=5), {}),
    "echo": ("echo", SpecOptions(), {"SGLANG_ECHO_POLICY": "echo"}),
    # The same ECHO trees verified padded-dense (B*W target tokens per step) instead of ragged.
    "echo-padded": ("echo", SpecOptions(), {"SGLANG_ECHO_POLICY": "echo", "SGLANG_ECHO_VERIFY": "padded"}),
    # ECHO Sec. 5.3's gating ablation: a gate at every depth / one threshold at the sweet spots.
    "echo-dense": ("echo", SpecOptions(), {"SGLANG_ECHO_POLICY": "dense-gating"}),
    "echo-fixed": ("echo", SpecOptions(), {"SGLANG_ECHO_POLICY": "fixed-threshold"}),
    # ECHO gating with the paper's LLaMA-3.1-8B thresholds whatever --calibration says.
    "echo-paper": ("echo", SpecOptions(), {"SGLANG_ECHO_POLICY": "echo"}),
}
UNCALIBRATED = {"echo-paper"}


def echo_env(name: str, args: argparse.Namespace) -> dict[str, str]:
    """The ECHO configs' drafter and calibration (``--echo-drafter``, ``--calibration``)."""
    env = dict(CONFIGS[name][2])
    if CONFIGS[name][0] == "echo":
        env["SGLANG_ECHO_DRAFTER"] = args.echo_drafter
        if args.calibration and name not in UNCALIBRATED:
            env["SGLANG_ECHO_CALIBRATION"] = str(Path(args.calibration).resolve())
    return env


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

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds

    @property
    def mat(self) -> float | None:
        """Tokens committed per verify step per request (sglang's accept length incl. bonus)."""
        return self.completion_tokens / self.verify_steps if self.verify_steps else None


@dataclass
class Report:
    machine: dict
    settings: dict
    runs: list[Run] = field(default_factory=list)


def _one_level(url: str, texts: list[str], concurrency: int, max_new: int) -> tuple[float, list[Generation]]:
    """Send ``texts`` with ``concurrency`` clients; wall seconds and the generations."""

    def ask(text: str) -> Generation:
        return generate(url, text=text, max_new_tokens=max_new, temperature=0.0)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        outs = list(pool.map(ask, texts))
    return time.perf_counter() - t0, outs


def run(args: argparse.Namespace) -> Report:
    from transformers import AutoTokenizer

    from ..models.drafts import default_eagle3_head
    from ..models.prepare import prepare

    model = prepare(dtype=args.dtype).path
    draft = Path(args.draft) if args.draft else default_eagle3_head(model)
    with_draft = {"eagle3"} | ({"echo"} if args.echo_drafter == "eagle3" else set())
    tokenizer = AutoTokenizer.from_pretrained(model)
    levels = [int(c) for c in args.concurrency.split(",")]
    pool = [p.as_text(tokenizer) for p in load_mixed(args.per_set)]
    report = Report(
        machine={"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        settings={"model": str(model), "draft": str(draft), "dtype": args.dtype, "max_new": args.max_new,
                  "concurrency": levels, "prompts": len(pool), "per_set": args.per_set,
                  "echo_drafter": args.echo_drafter, "calibration": args.calibration},
    )
    reference: dict[int, list[list[int]]] = {}
    for name in args.configs.split(","):
        spec, knobs, _ = CONFIGS[name]
        opts = ServerOptions(model_path=model, port=args.port, spec=spec, draft_path=draft if spec in with_draft else None,
                             spec_options=knobs, dtype=args.dtype, max_running_requests=max(levels),
                             extra_env=tuple(echo_env(name, args).items()))
        with SGLangServer(opts) as srv:
            _one_level(srv.base_url, pool[:2], 2, 8)  # warm-up: first-request costs are not throughput
            for c in levels:
                prompts = (pool * (1 + (c * args.rounds) // len(pool)))[: max(c * args.rounds, c)]
                seconds, outs = _one_level(srv.base_url, prompts, c, args.max_new)
                ids = [o.output_ids for o in outs]
                steps = sum(int(o.meta.get("spec_verify_ct", 0)) for o in outs)
                lossless = None if name == "none" else ids == reference.get(c)
                if name == "none":
                    reference[c] = ids
                r = Run(name, c, len(prompts), seconds, sum(len(i) for i in ids), steps, lossless, srv.startup_seconds)
                report.runs.append(r)
                mat = f"{r.mat:.2f}" if r.mat else "-"
                print(f"{name:>10} c={c:<3} {r.tokens_per_s:7.2f} tok/s  MAT {mat:>5}  lossless {lossless}", flush=True)
    return report


def markdown(report: Report) -> str:
    base = {r.concurrency: r.tokens_per_s for r in report.runs if r.config == "none"}
    lines = [
        f"Machine: {report.machine['platform']}, {report.machine['cpus']} CPUs. "
        f"Settings: {json.dumps(report.settings)}",
        "",
        "| config | concurrency | tokens/s | speedup vs none | MAT | lossless vs none | startup s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report.runs:
        speed = f"{r.tokens_per_s / base[r.concurrency]:.2f}x" if r.concurrency in base else "-"
        mat = f"{r.mat:.2f}" if r.mat else "-"
        startup = f"{r.startup_seconds:.0f}" if r.startup_seconds else "-"
        lines.append(f"| {r.config} | {r.concurrency} | {r.tokens_per_s:.2f} | {speed} | {mat} | {r.lossless} | {startup} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="echo-bench serve", description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="none,ngram,eagle3,echo", help=f"comma list of {','.join(CONFIGS)}")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=1, help="requests per level = concurrency x rounds")
    ap.add_argument("--per-set", type=int, default=10, help="prompts taken from each prompt set")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--dtype", default="float32", help="float32 keeps the token-for-token check exact")
    ap.add_argument("--draft", default=None, help="EAGLE-3 head (default: the shipped head)")
    ap.add_argument("--echo-drafter", choices=("eagle3", "ngram"), default="eagle3", help="the drafter of the echo* configs")
    ap.add_argument("--calibration", default=None, help="echo-calibrate output for the echo* configs (default: paper gates)")
    ap.add_argument("--port", type=int, default=30400)
    ap.add_argument("--out", default="benchmarks/results/cpu")
    args = ap.parse_args(argv)
    report = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = {"command": "echo-bench serve " + " ".join(argv or []), **asdict(report),
            "derived": [{"config": r.config, "concurrency": r.concurrency, "tokens_per_s": r.tokens_per_s, "mat": r.mat} for r in report.runs]}
    (out / "serve.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / "serve.md").write_text(markdown(report))
    print(markdown(report))
