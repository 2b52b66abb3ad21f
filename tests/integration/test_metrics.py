"""EchoMetrics: step timing, per-request tree depths, sglang's labels, histograms (no server),
and one real ECHO server's /metrics read through sgl-router (``test_server_metrics_through_the_router``)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import requests
import torch

from sglang_echo.bench.level_metrics import parse_page
from sglang_echo.integration import metrics as M
from sglang_echo.integration.config import load_config, make_echo_policy
from sglang_echo.integration.metric_catalog import BY_KEY, SERIES, Sample, bucket_bounds, check_page
from sglang_echo.integration.metrics import DEPTH_KEY, EchoMetrics, TimedDrafter, record_tree_depths, timing_sync
from sglang_echo.integration.ngram_worker import History, RequestDrafters, build_ngram_drafts

TIMERS = ("timed_steps", "control_seconds", "draft_seconds", "verify_seconds", "step_seconds")


LABELS = {"model_name": "smollm2", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}


@pytest.fixture
def prom_metrics():
    """An enabled EchoMetrics (sglang's labels of a TP rank 0) on its own registry."""
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    m = EchoMetrics(32, enabled=True, labels=LABELS, writer=True, registry=reg)
    assert m._m is not None
    return m, _Labelled(reg)


class _Labelled:
    """``get_sample_value`` with the identity labels added."""

    def __init__(self, reg):
        self.reg = reg

    def get_sample_value(self, name, labels=None):
        return self.reg.get_sample_value(name, {**LABELS, **(labels or {})})


def test_timing_totals_and_counters_accumulate(prom_metrics):
    m, reg = prom_metrics
    m.on_timing(control=0.001, draft=0.010, verify=0.030, step=0.045)
    m.on_timing(control=0.002, draft=0.012, verify=0.031, step=0.050)
    t = m.totals
    assert t["timed_steps"] == 2
    assert t["control_seconds"] == pytest.approx(0.003) and t["step_seconds"] == pytest.approx(0.095)
    assert t["draft_seconds"] == pytest.approx(0.022) and t["verify_seconds"] == pytest.approx(0.061)
    assert reg.get_sample_value("echo_control_seconds_total") == pytest.approx(0.003)
    assert reg.get_sample_value("echo_step_seconds_total") == pytest.approx(0.095)
    assert reg.get_sample_value("echo_draft_seconds_total") == pytest.approx(0.022)
    assert reg.get_sample_value("echo_verify_seconds_total") == pytest.approx(0.061)
    assert reg.get_sample_value("echo_timed_steps_total") == 2
    assert reg.get_sample_value("echo_budget_k_max") == 32


def test_budget_decisions_are_counted_by_arm_and_reason(prom_metrics):
    m, reg = prom_metrics
    m.on_budget_step(("draft", "explore"), 0.25)
    m.on_budget_step(("plain", "model"), 0.1, premium=0.25)
    m.on_budget_step(("plain", "model"), 0.1, premium=0.18)
    m.on_budget_step(("plain", "full"), 0.1)  # a full batch weighs nothing: the gauge keeps 0.18
    m.on_budget_step(None, 9.0)  # a step no cap() decided: not counted
    explore, model = {"arm": "draft", "reason": "explore"}, {"arm": "plain", "reason": "model"}
    assert reg.get_sample_value("echo_budget_steps_total", explore) == 1
    assert reg.get_sample_value("echo_budget_step_seconds_total", explore) == pytest.approx(0.25)
    assert reg.get_sample_value("echo_budget_steps_total", model) == 2
    assert reg.get_sample_value("echo_budget_step_seconds_total", model) == pytest.approx(0.2)
    assert reg.get_sample_value("echo_budget_premium") == pytest.approx(0.18)


def test_timing_never_raises():
    m = EchoMetrics(8, enabled=False)  # totals only
    m.on_timing(control=0.5, draft=0.0, verify=0.0, step=1.0)
    assert m.totals["control_seconds"] == 0.5 and m._m is None

    class Broken:
        def inc(self, *_):
            raise RuntimeError("registry gone")

    m._m = {k: Broken() for k in TIMERS}  # the children EchoMetrics writes to
    m.on_timing(control=0.1, draft=0.1, verify=0.1, step=0.4)  # logged once, not raised
    m.on_timing(control=-1e-9, draft=0.1, verify=0.1, step=0.4)
    assert m.totals["timed_steps"] == 3


def test_timed_drafter_counts_only_propose():
    class Slow:
        forwards = 3

        def propose(self, frontier, k):
            time.sleep(0.02)
            return (frontier, k)

    calls = []
    d = TimedDrafter(Slow(), sync=lambda: calls.append(1))
    assert d.propose("f", 2) == ("f", 2)
    d.propose("g", 1)
    assert 0.035 < d.seconds < 0.5
    assert d.forwards == 3 and len(calls) == 4  # synced before and after each propose


def test_timing_sync_is_a_noop_off_cuda(monkeypatch):
    monkeypatch.setenv(M.SYNC_ENV, "1")
    assert timing_sync("cpu") is M._noop
    monkeypatch.delenv(M.SYNC_ENV)
    assert timing_sync("cuda:0") is M._noop  # without the variable: host times, no sync


def _req(n_out: int):
    return SimpleNamespace(customized_info=None, output_ids=list(range(n_out)))


def test_tree_depths_are_token_aligned():
    """Each step's depth lands at the index of the first token the step commits; the sum over
    the request's list is its summed tree depth whatever sglang slices off when it streams."""
    a, b = _req(1), _req(1)  # after prefill: one output token
    record_tree_depths([a, b], [3, 0])
    assert a.customized_info[DEPTH_KEY] == [0, 3] and b.customized_info[DEPTH_KEY] == [0, 0]
    a.output_ids += [7, 7, 7]  # the step committed 3 tokens
    b.output_ids += [7]
    record_tree_depths([a, b], [2, 4])
    assert a.customized_info[DEPTH_KEY] == [0, 3, 0, 0, 2]
    assert b.customized_info[DEPTH_KEY] == [0, 0, 4]
    # sglang's token slicing (send offsets) partitions the list: the sum survives any split.
    la = a.customized_info[DEPTH_KEY]
    assert sum(la[0:2]) + sum(la[2:5]) == 5


def test_on_tree_depths_toggle_and_errors(monkeypatch):
    r = _req(2)
    m = EchoMetrics(8, enabled=False)
    m.on_tree_depths([r], torch.tensor([4]))
    assert r.customized_info == {DEPTH_KEY: [0, 0, 4]}
    m.on_tree_depths([object()], torch.tensor([1]))  # no customized_info attribute: logged, not raised
    monkeypatch.setenv(M.DEPTH_ENV, "0")
    off = EchoMetrics(8, enabled=False)
    r2 = _req(1)
    off.on_tree_depths([r2], torch.tensor([4]))
    assert r2.customized_info is None


def test_ngram_drafts_time_control_and_report_depths():
    cfg = load_config(environ={"SGLANG_ECHO_DRAFTER": "ngram", "SGLANG_ECHO_POLICY": "echo", "SGLANG_ECHO_K_MAX": "12"})
    pol, W = make_echo_policy(cfg), cfg.resolved_width()
    rd = RequestDrafters()
    hists = [History([1, 2, 3, 4, 1, 2, 3, 5, 1, 2], [3]), History([7, 8, 9], [7]), History([4] * 12, [4])]
    drafters = [rd.sync(str(i), h) for i, h in enumerate(hists)]
    _, _, step = build_ngram_drafts(pol, drafters, torch.tensor([h[-1] for h in hists]), W)
    assert step.control_s > 0 and step.propose_s > 0
    assert step.depths.shape == (3,) and int(step.depths.max()) <= cfg.max_depth
    assert bool((step.depths >= 0).all()) and bool(((step.depths == 0) == (step.sizes == 1)).all())


# -- sglang's labels, one writer per series, histograms ---------------------------------------------


def _page(reg) -> list:
    from prometheus_client import generate_latest

    return parse_page(generate_latest(reg).decode())


def _sglang_line(labels=LABELS) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"sglang:num_running_reqs{{{inner}}} 3.0\n"


def _step(sizes, depths, cap=None):
    sizes = torch.tensor(sizes)
    return SimpleNamespace(
        verified=int(sizes.sum()),
        cap=cap,
        sizes=sizes,
        width=int(sizes.max()),
        gate_evaluated=torch.tensor([0, 3]),
        gate_passed=torch.tensor([0, 2]),
        depths=torch.tensor(depths),
    )


def test_every_series_carries_sglangs_labels_and_exists_from_the_start(prom_metrics):
    """A fresh server's page: every series without ECHO labels is there (counters at 0, so an
    alert on echo_budget_exceeded_total has a series to watch), each with sglang's labels."""
    m, reg = prom_metrics
    samples = _page(reg.reg)
    always = [s.key for s in SERIES if not s.labels]
    assert check_page(samples + parse_page(_sglang_line()), always=always) == []
    assert reg.get_sample_value("echo_budget_exceeded_total") == 0
    assert reg.get_sample_value("echo_budget_k_max") == 32
    echo = [x for x in samples if x.name.startswith("echo_") and not x.name.endswith("_created")]
    assert echo and all(LABELS.items() <= x.labels.items() for x in echo)
    m.draft_fault("raise")
    m.on_budget_step(("draft", "explore"), 0.1)
    m.on_step(_step([3, 1], [2, 0]), 4)
    labelled = {
        x.name: x.labels
        for x in _page(reg.reg)
        if x.name in ("echo_draft_faults_total", "echo_budget_steps_total", "echo_gate_evaluated_total")
    }
    assert labelled["echo_draft_faults_total"] == {**LABELS, "kind": "raise"}
    assert labelled["echo_budget_steps_total"] == {**LABELS, "arm": "draft", "reason": "explore"}
    assert labelled["echo_gate_evaluated_total"] == {**LABELS, "depth": "1"}


def test_check_page_finds_what_an_operator_could_not_join():
    """check_page (run on every real server's page by tests/integration/conftest.py's scrape)
    refuses the unlabelled series of old, labels that match no sglang series, unknown names,
    a missing series and broken histograms."""
    from prometheus_client import CollectorRegistry

    sglang = parse_page(_sglang_line())
    bare = parse_page("echo_steps_total 3.0\n")
    assert "missing sglang labels" in check_page(bare + sglang)[0]
    other_rank = parse_page(_sglang_line({**LABELS, "tp_rank": "1"}))
    reg = CollectorRegistry()
    EchoMetrics(8, enabled=True, labels=LABELS, writer=True, registry=reg)
    page = _page(reg)
    assert any("match no sglang scheduler series" in p for p in check_page(page + other_rank))
    inner = ",".join(f'{k}="{v}"' for k, v in LABELS.items())
    assert "not an ECHO series" in check_page(parse_page(f"echo_stepz_total{{{inner}}} 1\n") + sglang)[0]
    assert check_page(sglang, always=["exceeded"]) == ["echo_budget_exceeded: not on the page"]
    fault = parse_page(f"echo_draft_faults_total{{{inner}}} 1\n")
    assert "missing ECHO labels ['kind']" in check_page(fault + sglang)[0]
    hist = [x for x in page if x.name == "echo_tree_depth_bucket"]
    assert check_page(hist + sglang) == []
    assert "buckets" in check_page(hist[1:] + sglang)[0]  # a bound missing
    broken = [Sample(x.name, x.labels, 5.0 if x.labels["le"] == "0.0" else x.value) for x in hist]
    assert "not cumulative" in check_page(broken + sglang)[0]


def test_histograms_agree_with_the_counters(prom_metrics):
    m, reg = prom_metrics
    m.on_step(_step([5, 1, 3], [4, 0, 2]), 9)
    m.on_accept([3, 0, 1])  # accept lengths 4, 1, 2
    m.on_step(_step([2, 2], [1, 1]), 4)
    m.on_accept(torch.tensor([1, 0]))  # a tensor too: 2, 1
    m.on_accept([])
    v = reg.get_sample_value
    assert v("echo_accept_length_sum") == v("echo_accepted_tokens_total") == 10
    assert v("echo_accept_length_count") == 5
    assert v("echo_accept_length_bucket", {"le": "1.0"}) == 2 and v("echo_accept_length_bucket", {"le": "2.0"}) == 4
    assert v("echo_verified_tokens_per_step_sum") == v("echo_verified_tokens_total") == 13
    assert v("echo_verified_tokens_per_step_count") == v("echo_steps_total") == 2
    assert v("echo_verified_tokens_per_step_bucket", {"le": "8.0"}) == 1  # the 4-token step (the 9 is over 8)
    assert v("echo_tree_depth_count") == 5 and v("echo_tree_depth_sum") == 8
    assert v("echo_tree_depth_bucket", {"le": "0.0"}) == 1


def test_bulk_observation_is_observe_value_by_value():
    """observe_many writes what one observe per value would (it reads prometheus_client's
    histogram layout: this fails if a client release changes it)."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    s = BY_KEY["accept_length"]
    values = [1, 1, 2, 3, 7, 8, 9, 16, 17, 64, 65, 200]
    pages = []
    for bulk in (True, False):
        reg = CollectorRegistry()
        h = Histogram("h", "h", ["tp_rank"], buckets=bucket_bounds(s), registry=reg).labels(tp_rank="0")
        if bulk:
            M.observe_many(h, torch.tensor(values), bucket_bounds(s))
        else:
            for x in values:
                h.observe(x)
        pages.append([line for line in generate_latest(reg).decode().splitlines() if "_created" not in line])
    assert pages[0] == pages[1]
    assert 'h_bucket{le="8.0",tp_rank="0"} 6.0' in pages[0] and 'h_count{tp_rank="0"} 12.0' in pages[0]


def test_a_rank_sglang_does_not_export_from_writes_nothing():
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    m = EchoMetrics(8, enabled=True, labels={**LABELS, "tp_rank": "1"}, writer=False, registry=reg)
    m.on_step(_step([2, 1], [1, 0]), 3)
    m.on_accept([1, 0])
    assert m._m is None and m.totals["steps"] == 1 and m.totals["accepted"] == 3
    assert not [x for x in _page(reg) if x.name.startswith("echo_")]


def test_labels_and_writer_are_sglangs():
    """In a published sglang context (the scheduler's), sglang_labels() are exactly the labels
    sglang's SchedulerMetricsCollector puts on its own series, and sglang_writes_metrics() agrees
    with its stats-logging rank, for TP rank 0 and for a second TP rank."""
    from prometheus_client import REGISTRY
    from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector
    from sglang.srt.runtime_context import get_context, get_parallel

    before = set(REGISTRY._collector_to_names)
    try:
        for rank in (0, 1):
            with (
                get_context().override_server_args(served_model_name="echo-test", enable_metrics=True, tp_size=2) as sa,
                get_parallel().override(
                    tp_rank=rank, pp_rank=0, moe_ep_rank=0, dp_rank=None, attn_tp_rank=rank, attn_cp_rank=0
                ),
            ):
                ctx = SchedulerMetricsCollector.init_new(
                    server_args=sa, enable_priority_scheduling=False, enable_lora=False, enable_hierarchical_cache=False
                )
                want = {k: str(v) for k, v in ctx.collector.labels.items()}
                assert M.sglang_labels() == want and want["tp_rank"] == str(rank)
                assert M.sglang_writes_metrics() == ctx.is_stats_logging_rank == (rank == 0)
                for c in set(REGISTRY._collector_to_names) - before:
                    REGISTRY.unregister(c)
    finally:
        for c in set(REGISTRY._collector_to_names) - before:
            REGISTRY.unregister(c)


# -- one real ECHO server behind sgl-router ----------------------------------------------------------


def _start_router(worker_url: str):
    """sgl-router with deploy/compose.yaml's router arguments, on free local ports, in front
    of ``worker_url``; returns (process, its URL, its metrics URL) once it is ready."""
    import subprocess
    import sys

    from sglang_echo.serve.server import die_with_parent, find_free_port_pair

    from ..conftest import INTEGRATION_PORTS, LOG_DIR, worker_ports
    from ..deploy.test_compose import router_command

    port = find_free_port_pair(*worker_ports(INTEGRATION_PORTS))
    cmd = router_command(worker_url)
    for flag, value in (
        ("--host", "127.0.0.1"),
        ("--port", str(port)),
        ("--prometheus-host", "127.0.0.1"),
        ("--prometheus-port", str(port + 1)),
    ):
        cmd = [f"{flag}={value}" if a.startswith(flag + "=") else a for a in cmd]
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"router-{port}-{time.strftime('%H%M%S')}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            die_with_parent([sys.executable, "-m", "sglang_router.launch_router", *cmd]),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sgl-router exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if requests.get(url + "/readiness", timeout=2).ok:  # ready: the worker is healthy
                return proc, url, f"http://127.0.0.1:{port + 1}/metrics"
        except requests.RequestException:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"sgl-router was not ready after 120 s (log {log})")


@pytest.mark.server
def test_server_metrics_through_the_router(smollm2_dir, smollm2_prompts):
    """An ECHO server (n-gram drafter, no head: deploy's ngram overlay) with --enable-metrics,
    behind sgl-router run with compose.yaml's arguments: requests through the router are
    served with speculation, and the server's /metrics passes check_page (every echo_* series
    with sglang's labels and values, buckets in order: conftest.scrape) with histograms that
    agree with the counters."""
    from .conftest import run_staggered, scrape, start

    srv = start(
        smollm2_dir,
        spec="echo",
        env={"SGLANG_ECHO_DRAFTER": "ngram", "SGLANG_ECHO_POLICY": "echo"},
        tag="metrics-router",
    )
    router = None
    try:
        router, url, router_metrics = _start_router(srv.base_url)
        got = run_staggered(url, smollm2_prompts[:4])
        metrics = scrape(srv.base_url)
        router_page = requests.get(router_metrics, timeout=30)
    finally:
        if router is not None:
            router.terminate()
            router.wait(timeout=30)
        srv.stop()
    steps = sum(g.meta["spec_verify_ct"] for g in got)
    assert all(g.output_ids for g in got) and steps > 0
    assert metrics["echo_accept_length_sum"] == metrics["echo_accepted_tokens_total"] > 0
    assert metrics["echo_verified_tokens_per_step_count"] == metrics["echo_steps_total"] > 0
    assert metrics["echo_verified_tokens_per_step_sum"] == metrics["echo_verified_tokens_total"]
    assert metrics["echo_accept_length_count"] >= steps  # one per request and step (plus warm-up's)
    assert metrics["echo_tree_depth_count"] > 0 and metrics["echo_tree_depth_sum"] > 0  # the drafter drafted
    assert metrics["echo_budget_exceeded_total"] == 0
    assert router_page.ok and "# TYPE" in router_page.text  # the router's own page (compose's Prometheus scrapes it)
