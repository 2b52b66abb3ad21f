"""`echo-bench serve`'s bookkeeping on canned data: meta_info -> u, /metrics deltas, tables."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from sglang_echo.bench.level_metrics import echo_deltas, parse_echo_metrics
from sglang_echo.bench.serve import Report, Run, markdown, quartiles, report_from_json, request_record, warmup_level
from sglang_echo.bench.serve_tables import cpu_savings, ratio_interval, speedups

# What an ECHO server's /generate returns for one request: 3 verify steps with trees of depth
# 4, 2 and 0 (root only); 1 prefill token + 7 committed by the steps.
ECHO_META = {
    "completion_tokens": 8,
    "spec_verify_ct": 3,
    "spec_cap_length": 4.5,
    "spec_num_correct_drafts": 4,
    "echo_tree_depth": [0, 4, 0, 0, 2, 0, None, 0],
}


def test_request_record_echo():
    r = request_record(ECHO_META, list(range(8)), dataset="chat", seconds=0.5)
    assert r["mat"] == pytest.approx(8 / 3)
    assert r["depth_sum"] == 6 and r["depth"] == pytest.approx(2.0)
    assert r["u"] == pytest.approx(6 / 6)  # the drafting steps' 3 + 3 tokens over their depths 4 + 2
    assert r["u_drafts"] == pytest.approx(4 / 6)  # accepted drafts per drafted depth, no bonus
    assert r["k_mean"] == 4.5 and r["dataset"] == "chat" and r["seconds"] == 0.5


def test_request_record_static_and_none():
    eagle = request_record({"completion_tokens": 10, "spec_verify_ct": 5}, [0] * 10, nominal_depth=3)
    assert eagle["mat"] == 2 and eagle["depth"] == 3 and eagle["u"] == pytest.approx(2 / 3)
    plain = request_record({"completion_tokens": 10}, [0] * 10)
    assert plain["mat"] is None and plain["u"] is None
    roots_only = request_record({"completion_tokens": 4, "spec_verify_ct": 3, "echo_tree_depth": [0, 0, 0]}, [0] * 4)
    assert roots_only["depth"] == 0 and roots_only["u"] is None  # no draft, no utilisation
    # mostly plain steps (ECHO's cost budget under load): one depth-2 tree, both drafts accepted, in 20 steps
    mostly_plain = request_record(
        {
            "completion_tokens": 23,
            "spec_verify_ct": 20,
            "spec_num_correct_drafts": 2,
            "echo_tree_depth": [0, 2] + [0] * 21,
        },
        [0] * 23,
    )
    assert mostly_plain["u"] == pytest.approx(3 / 2) and mostly_plain["u_drafts"] == pytest.approx(1.0)
    assert mostly_plain["mat"] == pytest.approx(23 / 20)  # sglang's accept length keeps every step


def test_quartiles():
    q = quartiles([4, 1, 3, 2, 5])
    assert (q["n"], q["median"], q["q1"], q["q3"], q["mean"]) == (5, 3, 2, 4, 3)
    assert q["p5"] == pytest.approx(1.2) and q["p95"] == pytest.approx(4.8)
    assert quartiles([]) is None


PAGE = """# HELP echo_steps_total ECHO verify steps
# TYPE echo_steps_total counter
echo_steps_total {steps}
echo_verified_tokens_total {verified}
echo_target_tokens_total {verified}
echo_accepted_tokens_total {accepted}
echo_timed_steps_total {steps}
echo_control_seconds_total {control}
echo_draft_seconds_total 0.5
echo_verify_seconds_total 1.5
echo_step_seconds_total {step}
echo_gate_evaluated_total{{depth="2"}} 7.0
echo_budget_steps_total{{arm="plain",reason="model"}} {steps}
echo_budget_step_seconds_total{{arm="plain",reason="model"}} {step}
echo_budget_steps_total{{arm="draft",reason="explore"}} 2.0
echo_budget_step_seconds_total{{arm="draft",reason="explore"}} 0.5
echo_budget_k_max 64.0
echo_step_verified_tokens_max {vmax}
sglang:num_running_reqs{{model_name="m"}} 3.0
"""


def test_metrics_deltas():
    before = parse_echo_metrics(PAGE.format(steps=10, verified=100, accepted=30, control=0.01, step=1.0, vmax=20))
    after = parse_echo_metrics(PAGE.format(steps=30, verified=700, accepted=90, control=0.05, step=3.0, vmax=48))
    assert after['echo_gate_evaluated_total{depth="2"}'] == 7 and "sglang:num_running_reqs" not in str(after)
    d = echo_deltas(before, after)
    assert d["steps"] == 20 and d["verified_per_step"] == pytest.approx(30.0)
    assert d["k_max"] == 64 and d["step_verified_max"] == 48 and d["budget_fill"] == pytest.approx(30 / 64)
    assert d["control_share"] == pytest.approx(0.04 / 2.0)
    assert d["step_ms"] == pytest.approx(100.0) and d["control_ms"] == pytest.approx(2.0)
    assert d["draft_s"] == 0 and d["verify_s"] == 0  # unchanged counters
    assert d["budget_decisions"] == {"plain/model": {"steps": 20, "seconds": pytest.approx(2.0)}}  # explore: unchanged
    assert echo_deltas({}, {}) is None  # no ECHO counters (another algorithm, or metrics off)
    # a server without the timing counters (older ECHO): the rest still reported
    old = {k: v for k, v in after.items() if "seconds" not in k and "timed" not in k}
    d = echo_deltas({}, old)
    assert d["control_share"] is None and d["verified_per_step"] == pytest.approx(700 / 30)


def _report() -> Report:
    runs = []
    for c, tps_none, tps_echo in ((1, 10.0, 12.0), (8, 40.0, 44.0)):
        reqs = [
            request_record(ECHO_META | {"spec_verify_ct": 2 + i % 3}, [0] * 8, dataset=ds, seconds=1.0)
            for i, ds in enumerate(["chat", "math", "chat", "math"])
        ]
        plain = [request_record({"completion_tokens": 8}, [0] * 8, dataset=r["dataset"], seconds=1.2) for r in reqs]
        runs.append(Run("none", c, 4, 32 / tps_none, 32, 0, None, 30.0, None, plain, None))
        echo = echo_deltas(
            {}, parse_echo_metrics(PAGE.format(steps=20, verified=600, accepted=60, control=0.04, step=2.0, vmax=40))
        )
        runs.append(Run("echo", c, 4, 32 / tps_echo, 32, 12, True, 31.0, None, reqs, echo))
    return Report({"platform": "test", "cpus": 2}, {"model": "/m/SmolLM2"}, runs)


def test_markdown_tables():
    md = markdown(_report())
    assert "| echo | 8 | 44.00 | 1.10x |" in md
    assert "Draft utilisation per request" in md and "| echo | 1 | 4 |" in md
    assert "| echo | 1 | 20 | 30.0 | 40 | 64 |" in md and "2.00% | yes |" in md
    assert "Cost budget's decisions per level" in md  # 2 s of plain steps beside 0.5 s exploring: 80% / 20%
    assert "| echo | 8 | plain/model | 20 | 2.00 | 100.0 | 80.0% |" in md
    assert "| echo | 8 | draft/explore | 2 | 0.50 | 250.0 | 20.0% |" in md
    # Table 1's shape: per prompt set at the lowest concurrency, MAT and speedup vs none
    assert "| config | chat MAT | chat speedup | math MAT | math speedup | avg speedup |" in md
    assert "1.20x" in md


def test_draft_yield_from_echo_counters_and_static_shapes():
    """ECHO Eq. 3's yield (accepted drafts over drafted tokens): an ECHO server's counters, a static
    tree's shape, nothing for plain decoding."""
    echo = Run("echo", 8, 4, 1.0, 40, 10, True, echo={"verified_tokens": 30.0, "accepted_tokens": 16.0})
    assert echo.draft_yield == pytest.approx(6 / 20)  # 10 of the 30 verified are roots, 10 of the 16 accepted bonuses
    # 4 requests, 40 tokens, 12 steps: 4 prefill tokens, 12 bonus tokens, 24 accepted of 12 x 4 drafted
    static = Run("eagle3", 8, 4, 1.0, 40, 12, True, nominal_depth=3, nominal_tokens=5)
    assert static.draft_yield == pytest.approx(24 / 48)
    plain = Run("none", 8, 4, 1.0, 40, 0, None)
    assert (
        plain.draft_yield is None
        and Run("echo", 8, 4, 1.0, 14, 10, True, echo={"verified_tokens": 10.0, "accepted_tokens": 10.0}).draft_yield
        is None
    )  # root-only steps drafted nothing
    md = markdown(Report({"platform": "test", "cpus": 2}, {}, [plain, static]))
    assert "| eagle3 | 8 | 40.00 | 1.00x | 3.33 | True | - | - | - | 0.500 |" in md


def test_passes_compare_within_a_pass():
    """--repeats: each pass's speedup is against that pass's none (the machine drifts between
    passes), and a summary gives every pass and the median."""
    runs = []
    for rep, (none_tps, echo_tps) in enumerate(((40.0, 44.0), (30.0, 36.0), (50.0, 50.0))):
        runs += [
            Run("none", 8, 8, 64 / none_tps, 64, 0, None, repeat=rep),
            Run("echo", 8, 8, 64 / echo_tps, 64, 32, True, repeat=rep),
        ]
    assert speedups(runs)[("echo", 8)] == pytest.approx([1.1, 1.2, 1.0])
    md = markdown(Report({"platform": "test", "cpus": 2}, {}, runs))
    assert "| echo (pass 2) | 8 | 36.00 | 1.20x |" in md
    # geometric mean 1.32^(1/3); interval exp(mean log +- t(0.975, 2) = 4.303 x sd 0.0912 / sqrt 3)
    assert "| echo | 8 | 1.10x / 1.20x / 1.00x | 1.10x | 1.00x | 1.10x | 0.87-1.38x |" in md
    assert "per pass" not in markdown(Report({"platform": "test", "cpus": 2}, {}, runs[:2]))  # one pass: no summary


def test_ratio_interval_is_students_t_on_the_log_ratios():
    geo, lo, hi = ratio_interval([math.exp(0.1), math.exp(-0.1)])
    assert geo == pytest.approx(1.0)
    # t(0.975, 1) = 12.706; sd of (0.1, -0.1) = 0.1414; half width 12.706 x 0.1414 / sqrt(2) = 1.2706
    assert (lo, hi) == pytest.approx((math.exp(-1.2706), math.exp(1.2706)), rel=1e-4)
    assert ratio_interval([0.9, 0.9, 0.9]) == pytest.approx((0.9, 0.9, 0.9))  # no spread, no width
    _, lo, hi = ratio_interval([0.95, 0.97, 0.96, 0.94, 0.96, 0.95])  # consistently slower: 1.0 is outside
    assert hi < 1.0 and lo > 0.9


def test_twin_none_server_is_compared_like_any_config():
    """``none-twin`` (a second plain server) gets a speedup and a lossless check against ``none``:
    its spread over the passes is the host's noise alone."""
    runs = []
    for rep, (a, b) in enumerate(((40.0, 36.0), (30.0, 33.0))):
        runs += [
            Run("none", 8, 8, 64 / a, 64, 0, None, repeat=rep),
            Run("none-twin", 8, 8, 64 / b, 64, 0, True, repeat=rep),
        ]
    assert speedups(runs)[("none-twin", 8)] == pytest.approx([0.9, 1.1])
    assert "| none-twin | 8 | 0.90x / 1.10x |" in markdown(Report({"platform": "test", "cpus": 2}, {}, runs))


def test_server_cpu_per_token_compares_within_a_pass():
    """Server CPU per token beside tokens/s: none's over the config's, per pass; runs without a
    reading (older files) show none."""
    runs = []
    for rep, (none_cpu, echo_cpu) in enumerate(((6.4, 3.2), (6.4, 6.4))):
        runs += [
            Run("none", 8, 8, 2.0, 64, 0, None, repeat=rep, server_cpu_s=none_cpu),
            Run("echo", 8, 8, 2.0, 64, 32, True, repeat=rep, server_cpu_s=echo_cpu),
        ]
    assert runs[0].cpu_ms_per_token == pytest.approx(100.0)
    assert cpu_savings(runs)[("echo", 8)] == pytest.approx([2.0, 1.0])
    md = markdown(Report({"platform": "test", "cpus": 2}, {}, runs))
    assert "| echo | 8 | 32.00 | 1.00x | 2.00 | True | - | 50.0 | 2.00x |" in md
    assert "| echo | 8 | 2.00x / 1.00x | 1.50x | 1.00x |" in md
    assert Run("none", 8, 8, 2.0, 64, 0, None).cpu_ms_per_token is None


def test_json_round_trip_and_old_files(tmp_path):
    from dataclasses import asdict

    rep = _report()
    back = report_from_json(json.loads(json.dumps(asdict(rep))))
    assert back.runs[1].utilisation == rep.runs[1].utilisation
    assert back.runs[1].derived()["control_share"] == pytest.approx(0.02)
    old = {
        "machine": {"platform": "x", "cpus": 2},
        "settings": {},
        "runs": [
            {
                "config": "none",
                "concurrency": 1,
                "requests": 2,
                "seconds": 1.0,
                "completion_tokens": 10,
                "verify_steps": 0,
                "lossless": None,
                "startup_seconds": 3.0,
            }
        ],
    }
    r = report_from_json(old).runs[0]
    assert r.per_request == [] and r.echo is None and r.utilisation is None
    assert "Draft utilisation" not in markdown(report_from_json(old))


def test_side_by_side_servers_start_together_and_a_failed_start_stops_the_others():
    """--interleave enters every server at once; where one fails to start, the ones that did are
    stopped and the error is raised."""
    import threading
    from contextlib import ExitStack

    from sglang_echo.bench import serve

    barrier = threading.Barrier(3, timeout=10)  # all three starts must be in flight together
    stopped = []

    class Server:
        def __init__(self, name, fails=False):
            self.name, self.fails = name, fails

        def __enter__(self):
            barrier.wait()
            if self.fails:
                raise RuntimeError(f"{self.name} did not start")
            return self.name

        def __exit__(self, *exc):
            stopped.append(self.name)

    with ExitStack() as stack:
        assert serve._enter_all(stack, [Server("a"), Server("b"), Server("c")]) == ["a", "b", "c"]
    assert stopped == ["c", "b", "a"]
    barrier.reset()
    stopped.clear()
    with pytest.raises(RuntimeError, match="b did not start"):
        with ExitStack() as stack:
            serve._enter_all(stack, [Server("a"), Server("b", fails=True), Server("c")])
    assert sorted(stopped) == ["a", "c"]


def test_server_args_reach_every_started_server(monkeypatch):
    from sglang_echo.bench import serve_endpoint
    from sglang_echo.bench.load import Level
    from sglang_echo.serve.flags import build_command

    monkeypatch.setattr("sglang_echo.serve.flags.resolve_device", lambda _d: "cpu")
    bench = SimpleNamespace(
        args=_server_args(server_args="--mem-fraction-static 0.25"),
        heads={},
        pick=None,
        levels=[Level(8)],
        model="/models/target",
    )
    argv = build_command(serve_endpoint.StartedServer(bench, "none", 30400).opts).argv
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.25"


def test_max_new_jitter_spreads_budgets_the_same_way_every_time():
    from sglang_echo.bench.serve import max_new_tokens

    assert max_new_tokens(64, 0, 5) == [64] * 5
    budgets = max_new_tokens(64, 32, 130)
    assert budgets == max_new_tokens(64, 32, 130)  # every config and pass asks for the same
    assert min(budgets) == 32 and max(budgets) == 96 and sum(budgets) == 64 * 130  # two full cycles of 65
    assert len(set(budgets[:8])) == 8  # one closed-loop wave of 8 finishes at 8 different steps
    assert min(max_new_tokens(4, 10, 30)) >= 1


def _server_args(**kw) -> SimpleNamespace:
    """The options StartedServer reads, as echo-bench serve's defaults leave them."""
    return SimpleNamespace(
        **{
            "dtype": "float32",
            "max_total_tokens": None,
            "echo_drafter": "eagle3",
            "calibration": None,
            "device": None,
            "load_format": None,
            "token_shape": None,
            "attention_backend": None,
            "server_args": "",
            "sim": None,
            **kw,
        }
    )


def test_max_total_tokens_reaches_every_server(monkeypatch):
    """--max-total-tokens sizes each config's KV pool; the default stays make serve's, for the
    speculative servers with their draft slots for the bench's 256 running requests on top."""
    from sglang_echo.bench import serve_endpoint
    from sglang_echo.bench.load import Level
    from sglang_echo.serve.flags import CPU_MAX_TOTAL_TOKENS, build_command, draft_slots_per_request

    monkeypatch.setattr("sglang_echo.serve.flags.resolve_device", lambda _d: "cpu")
    for pool in (65536, None):
        bench = SimpleNamespace(
            args=_server_args(max_total_tokens=pool),
            heads={"eagle3": "/heads/eagle3"},
            pick=None,
            levels=[Level(8), Level(256)],
            model="/models/target",
        )
        for name in ("none", "eagle3", "echo-cost"):
            opts = serve_endpoint.StartedServer(bench, name, 30400).opts
            argv = build_command(opts).argv
            want = pool or CPU_MAX_TOTAL_TOKENS + 256 * draft_slots_per_request(opts)
            assert argv[argv.index("--max-total-tokens") + 1] == str(want)
            assert argv[argv.index("--max-running-requests") + 1] == "256"
            assert pool or (want > CPU_MAX_TOTAL_TOKENS) == (name != "none")
            assert "--load-format" not in argv and "--skip-tokenizer-init" not in argv


def test_gpu_target_options_reach_the_server_command(monkeypatch):
    """--load-format, --token-prompts (tokenizer init skipped), --device and --attention-backend go
    through ServerOptions into the command; an explicit backend comes after the platform's, so it
    wins; an open-loop level's cap sizes the running requests."""
    from sglang_echo.bench import serve_endpoint
    from sglang_echo.bench.load import Level
    from sglang_echo.serve.flags import build_command

    monkeypatch.setattr("sglang_echo.serve.flags.sgl_kernel_installed", lambda: True)
    args = _server_args(
        device="cuda", load_format="dummy", token_shape=(4, 16), attention_backend="fa3", dtype="bfloat16"
    )
    bench = SimpleNamespace(
        args=args, heads={}, pick=None, levels=[Level(64, 2.0), Level(64, float("inf"))], model="/models/llama"
    )
    command = build_command(serve_endpoint.StartedServer(bench, "none", 30400).opts)
    argv = command.argv
    assert command.device == "cuda" and "SGLANG_USE_CPU_ENGINE" not in command.env
    assert argv[argv.index("--load-format") + 1] == "dummy" and "--skip-tokenizer-init" in argv
    assert argv[argv.index("--max-running-requests") + 1] == "64"
    assert argv[argv.index("--dtype") + 1] == "bfloat16"
    args.device = "cpu"
    argv = build_command(serve_endpoint.StartedServer(bench, "none", 30400).opts).argv
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--attention-backend"] == ["echo_torch", "fa3"]


def test_step_table_compares_full_batch_steps_within_a_pass():
    """Each level's scheduler steps (server log): ms per decode step and per target forward at batch =
    concurrency against none's of the same pass, the rest of the step, and the prefill forwards that
    admitted the level with what they spent beyond the target's forward."""
    runs = [
        Run(
            "none",
            8,
            8,
            2.0,
            64,
            0,
            None,
            step_times={
                "decode": {"8": [10, 1.0], "3": [2, 0.1]},
                "target_forward": {"8": [10, 0.9], "3": [2, 0.08]},
                "prefill": {"8": [1, 0.4]},
            },
        ),
        Run(
            "echo",
            8,
            8,
            2.0,
            64,
            32,
            True,
            step_times={
                "decode": {"8": [5, 0.55]},
                "target_forward": {"8": [5, 0.45]},
                "prefill": {"4": [2, 0.3], "8": [1, 0.5]},
                "target_prefill": {"4": [2, 0.25], "8": [1, 0.45]},
            },
        ),
        Run(
            "echo", 8, 8, 2.0, 64, 32, True, repeat=1, step_times={"decode": {"8": [5, 0.5]}}
        ),  # older log: no forwards
        Run("eagle3", 8, 8, 2.0, 64, 32, True),
    ]  # no step times (older file, GPU server): left out
    md = markdown(Report({"platform": "test", "cpus": 2}, {}, runs))
    assert "| none | 8 | 12 | 1.1 | 7.2 | 100.0 | - | 90.0 | - | 10.0 | 1 | 0.4 | - |" in md  # no target prefills
    assert "| echo | 8 | 5 | 0.6 | 8.0 | 110.0 | 1.100x | 90.0 | 1.000x | 20.0 | 3 | 0.8 | 0.10 |" in md
    assert "| echo (pass 2) | 8 | 5 | 0.5 | 8.0 | 100.0 | - | - | - | - | 0 | 0.0 | - |" in md  # no none in pass 2
    assert "| eagle3 | 8 |" not in md.split("Scheduler steps")[1]


def test_step_times_are_taken_around_each_level_from_the_server_log(monkeypatch, tmp_path):
    """measure() reads the CPU server's step-time totals before and after the level and keeps the
    difference; GPU servers (no step timer) get none."""
    from sglang_echo.bench import serve_endpoint
    from sglang_echo.bench.load import Level
    from sglang_echo.bench.requester import Outcome
    from sglang_echo.bench.targets import Target
    from sglang_echo.bench.workload import PromptItem
    from sglang_echo.platform import step_times

    log = tmp_path / "server.log"
    log.write_text(f'[t] {step_times.TAG} {{"decode": {{"2": [4, 0.4]}}}}\n')

    def send(target, item, max_new, stream, ignore_eos=False):
        with open(log, "a") as fh:
            fh.write(f'[t] {step_times.TAG} {{"decode": {{"2": [9, 0.9]}}, "prefill": {{"2": [1, 0.2]}}}}\n')
        return Outcome([1, 2], "", {}, 1.0)

    monkeypatch.setattr(serve_endpoint, "send", send)
    monkeypatch.setattr(step_times, "LOG_EVERY_S", 0.0)
    args = SimpleNamespace(
        rounds=1, min_requests=0, max_new_tokens=4, max_new_tokens_jitter=0, seed=0, stream=False, ignore_eos=False
    )
    items = [PromptItem("a", "x", text="a"), PromptItem("b", "y", text="b")]
    for device, want in (("cpu", {"decode": {"2": [5, 0.5]}, "prefill": {"2": [1, 0.2]}}), ("cuda", None)):
        srv = SimpleNamespace(
            base_url="http://x",
            log_path=log,
            command=SimpleNamespace(device=device),
            cpu_seconds=lambda: 0.0,
            startup_seconds=1.0,
        )
        bench = serve_endpoint.Bench(args, None, {}, None, [Level(2)], items)
        ep = serve_endpoint.Endpoint(Target("none", "http://x"), "none", None, srv)
        assert serve_endpoint.measure(bench, ep, Level(2), 0).step_times == want


def test_levels_have_concurrency_x_rounds_requests_and_at_least_min_requests():
    from sglang_echo.bench.serve import level_requests

    assert level_requests(8, 2) == 16 and level_requests(256, 1, 16) == 256
    assert level_requests(1, 1, 16) == 16 and level_requests(4, 0) == 4


def test_warmup_level_cycles_the_pool_at_a_batch_with_room_to_draft():
    texts, concurrency, budgets = warmup_level(["a", "b", "c"], 16, 64)
    assert texts == ["a", "b", "c"] * 5 + ["a"] and concurrency == 8 and budgets == [64] * 16
    assert warmup_level(["a", "b"], 0, 32) == (["a"], 1, [32])  # at least one request


def test_every_echo_config_is_a_valid_echo_setting():
    """Each ECHO config of ``echo-bench serve`` resolves and validates as the server will resolve it,
    and the baseline policies get the shapes their names promise."""
    from sglang_echo.bench.serve_configs import CONFIGS
    from sglang_echo.integration.config import load_config

    shapes = {}
    for name, (spec, _, env) in CONFIGS.items():
        if spec == "echo":
            cfg = load_config(environ=env)  # validates
            shapes[name] = (cfg.policy, cfg.max_depth, cfg.w_max, cfg.resolved_width())
    assert shapes["echo-static-8x10x60"] == ("static-tree", 8, 10, 60)
    assert shapes["echo-static-3x3x5"] == ("static-tree", 3, 3, 5)
    assert shapes["echo-chain"][0] == "chain" and shapes["echo-budgeted-chain"][0] == "budgeted-chain"
    assert shapes["echo"] == ("echo", 4, 4, 1 + 4 * 2 + 4) and shapes["echo-w1x2"] == ("echo", 4, 2, 1 + 4 + 2)
    assert {"echo", "echo-dense", "echo-fixed"} <= set(shapes)
