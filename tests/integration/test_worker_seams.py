"""The ECHO workers' seams with sglang, without a server: the constructors they re-implement are
pinned (compat.MIRRORS) and checked at start-up, each drafter with a head is one StepDrafter, and
the step epilogue both workers share (EchoSession) reports a step the same way whoever drafted it.
The servers (test_echo_server, test_dart_server, test_dflash_server, test_ngram_echo) run them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_echo.integration import compat
from sglang_echo.integration.metrics import EchoMetrics
from sglang_echo.integration.session import AcceptanceObservers, EchoSession, StepRecord

from .conftest import result_in_scheduler

# sglang is imported inside the tests (or in a subprocess under its CPU engine, where the kernels
# the EAGLE-3 model classes import are shimmed, as in the scheduler).


class _Constructed:
    def __init__(self, drift: bool = False):
        self.kept = 1
        self.pair, self.other = 2, 3
        if drift:
            self.added: int = 4


def test_assigned_attrs_reads_every_assignment_form():
    assert compat.assigned_attrs(_Constructed.__init__) == {"kept", "pair", "other", "added"}


def test_init_drift_names_what_changed(monkeypatch):
    same = compat.Mirror(__name__, "_Constructed", frozenset({"kept", "pair", "other", "added"}), "test")
    assert compat.init_drift(same) is None
    drifted = compat.Mirror(__name__, "_Constructed", frozenset({"kept", "pair", "gone"}), "test")
    msg = compat.init_drift(drifted)
    assert "now also sets ['added', 'other']" in msg and "no longer sets ['gone']" in msg
    monkeypatch.setattr(compat, "MIRRORS", (drifted,))
    monkeypatch.setattr(compat, "HOOKS", ())
    problems = compat.check_hooks("worker")
    assert len(problems) == 1 and "_Constructed.__init__" in problems[0]
    assert compat.check_hooks("register") == []  # the worker check only


def test_workers_mirror_sglang_and_each_head_drafter_has_its_strategy():
    """Where the scheduler runs (sglang's CPU engine): the whole compat table and both mirrors
    hold; EchoWorker.__init__ sets every attribute EAGLEWorkerV2.__init__ sets; each drafter with a
    head maps to its StepDrafter, n-gram to none."""
    code = (
        "from sglang_echo.integration import compat; "
        "from sglang_echo.integration.worker import EchoWorker; "
        "from sglang_echo.integration.drafting import StepDrafter, make_step_drafter; "
        "kinds = {k: make_step_drafter(k) for k in ('eagle3', 'dart', 'dflash')}; "
        "assert all(isinstance(d, StepDrafter) and d.kind == k for k, d in kinds.items()); "
        "flags = {k: (d.drafts_from_extend, d.draft_graphs) for k, d in kinds.items()}; "
        "missing = compat.EAGLE_WORKER_INIT_ATTRS - compat.assigned_attrs(EchoWorker.__init__); "
        "print('RESULT', compat.check_hooks(), sorted(missing), sorted(flags.items()))"
    )
    flags = "[('dart', (True, True)), ('dflash', (False, False)), ('eagle3', (True, True))]"
    assert result_in_scheduler(code) == f"[] [] {flags}"


def test_the_ngram_drafter_has_no_head_strategy():
    from sglang_echo.integration.drafting import make_step_drafter

    with pytest.raises(ValueError, match="'ngram' runs in EchoNgramWorker"):
        make_step_drafter("ngram")


# -- the shared step epilogue ------------------------------------------------------------------------
class _Budget:
    """A cost budget that records what the epilogue tells it."""

    def __init__(self):
        self.steps, self.accepts = [], []
        self.last_premium = 0.1

    def observe_step(self, **kw):
        self.steps.append(kw)
        return ("draft", "model")

    def observe_accept(self, counts):
        self.accepts.append(list(counts))


def _session(budget=None) -> EchoSession:
    echo = object.__new__(EchoSession)
    echo.device, echo.budget, echo.probe, echo.sync = "cpu", budget, None, lambda: None
    echo.policy = SimpleNamespace(budgeted=True)
    echo.metrics = EchoMetrics(12, enabled=False)
    return echo


def _record(sizes: list[int], cap: int) -> StepRecord:
    k = torch.tensor(sizes, dtype=torch.int32)
    return StepRecord(sizes=k, verified=int(k.sum()), cap=cap, width=max(sizes), forward_tokens=int(k.sum()))


def test_the_epilogue_reports_a_step_once_whoever_drafted_it():
    budget = _Budget()
    echo = _session(budget)
    st = _record([3, 1, 2], cap=8)
    st.control_s, st.draft_s, st.verify_s, st.draft_forwards, st.timed = 0.1, 0.2, 0.3, 2, True
    result = SimpleNamespace(cap_lens=None)
    echo.on_verified(result, st)
    echo.on_step_end(st, 0.7)
    assert result.cap_lens.tolist() == [3, 1, 2] and not st.timed
    t = echo.metrics.totals
    assert (t["steps"], t["verified"], t["target"], t["slots"], t["cap"], t["exceeded"]) == (1, 6, 6, 9, 8, 0)
    assert t["timed_steps"] == 1 and t["step_seconds"] == pytest.approx(0.7)
    assert budget.steps == [
        dict(
            batch_size=3,
            target_tokens=6,
            verified_tokens=6,
            draft_forwards=2,
            draft_s=pytest.approx(0.3),
            verify_s=0.3,
            step_s=0.7,
            cap=8,
        )
    ]


def test_the_epilogue_counts_a_step_over_its_budget():
    echo = _session()
    echo.on_verified(SimpleNamespace(), _record([3, 3], cap=4))  # 6 > max(4, bs = 2)
    echo.on_verified(SimpleNamespace(), _record([2, 2], cap=4))
    assert echo.metrics.totals["exceeded"] == 1 and echo.metrics.totals["steps"] == 2


def test_accepted_lengths_reach_the_metrics_and_the_budget():
    class SglangWorker:
        def on_verify_complete_cpu(self, num_correct_drafts_per_req, batch_size=0):
            self.seen = list(num_correct_drafts_per_req)

    class Worker(AcceptanceObservers, SglangWorker):
        pass

    w, budget = Worker(), _Budget()
    w.echo = _session(budget)
    w.on_verify_complete_cpu([2, 0, 1], 3)
    assert w.seen == [2, 0, 1] and budget.accepts == [[2, 0, 1]]
    assert w.echo.metrics.totals["accepted"] == 3 + 3  # the drafts plus each request's bonus token


def test_both_workers_time_their_prefills_for_the_budget():
    """A prefill batch reaches the session with its request count (what the cost budget charges
    drafting for, core/prefill_share.py) from either worker; a decode step does not, and without
    a budget the EAGLE worker does not time prefills at all (no device sync)."""
    code = """
from types import SimpleNamespace
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
from sglang.srt.speculative.ngram_worker import NGRAMWorker
from sglang_echo.integration import ngram_worker
from sglang_echo.integration.worker import EchoWorker

def sglang_step(self, batch, *a, **k):
    batch.forward_mode = ForwardMode.TARGET_VERIFY if batch.forward_mode == ForwardMode.DECODE else batch.forward_mode
    return 'result'

EAGLEWorkerV2.forward_batch_generation = NGRAMWorker.forward_batch_generation = sglang_step
seen = []
def session(budget):
    return SimpleNamespace(budget=budget, sync=lambda: None, on_prefill=lambda r, s: seen.append(r))
out = []
for cls, budget in ((EchoWorker, object()), (EchoWorker, None), (ngram_worker.EchoNgramWorker, object())):
    w = object.__new__(cls)
    w.echo = session(budget)
    if cls is EchoWorker:
        w._draft_worker = SimpleNamespace(echo_step=SimpleNamespace(timed=False))
    prefill = SimpleNamespace(forward_mode=ForwardMode.EXTEND, extend_lens=[5, 7, 2], is_extend_in_batch=False)
    decode = SimpleNamespace(forward_mode=ForwardMode.DECODE, extend_lens=None, is_extend_in_batch=False)
    out.append((w.forward_batch_generation(prefill), w.forward_batch_generation(decode), list(seen)))
    seen.clear()
print('RESULT', out)
"""
    expected = [("result", "result", [3]), ("result", "result", []), ("result", "result", [3])]
    assert result_in_scheduler(code) == str(expected)
