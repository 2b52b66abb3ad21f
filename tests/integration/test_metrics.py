"""EchoMetrics' step timing and per-request tree depths (no server)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from sglang_echo.integration import metrics as M
from sglang_echo.integration.config import load_config, make_echo_policy
from sglang_echo.integration.metrics import DEPTH_KEY, EchoMetrics, TimedDrafter, record_tree_depths, timing_sync
from sglang_echo.integration.ngram_worker import History, RequestDrafters, build_ngram_drafts

TIMERS = ("timed_steps", "control_seconds", "draft_seconds", "verify_seconds", "step_seconds")


@pytest.fixture
def prom_metrics():
    """An enabled EchoMetrics on prometheus_client's default registry, unregistered afterwards."""
    from prometheus_client import REGISTRY

    m = EchoMetrics(32, enabled=True)
    assert m._m is not None
    try:
        yield m, REGISTRY
    finally:
        for c in m._m.values():
            REGISTRY.unregister(c)


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
    m.on_budget_step(("plain", "model"), 0.1)
    m.on_budget_step(("plain", "model"), 0.1)
    m.on_budget_step(None, 9.0)  # a step no cap() decided: not counted
    explore, model = {"arm": "draft", "reason": "explore"}, {"arm": "plain", "reason": "model"}
    assert reg.get_sample_value("echo_budget_steps_total", explore) == 1
    assert reg.get_sample_value("echo_budget_step_seconds_total", explore) == pytest.approx(0.25)
    assert reg.get_sample_value("echo_budget_steps_total", model) == 2
    assert reg.get_sample_value("echo_budget_step_seconds_total", model) == pytest.approx(0.2)


def test_timing_never_raises():
    m = EchoMetrics(8, enabled=False)  # totals only
    m.on_timing(control=0.5, draft=0.0, verify=0.0, step=1.0)
    assert m.totals["control_seconds"] == 0.5 and m._m is None

    class Broken:
        def inc(self, *_):
            raise RuntimeError("registry gone")

    m._m = {k: Broken() for k in TIMERS}
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
