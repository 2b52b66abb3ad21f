"""A step whose cap leaves no room for drafts (EchoDraftWorker.plain_step) packs its roots directly:
it never reaches sglang's draft setup or the drafter, and hands verify the width-1 layout. The
server tests check such steps lossless end to end (budget cost, lazy extend); this checks the path."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_echo.integration.config import load_config, make_echo_policy
from sglang_echo.integration.faults import DraftGuard
from sglang_echo.integration.metrics import EchoMetrics
from sglang_echo.integration.ragged import MARK
from sglang_echo.integration.session import EchoSession, StepRecord

# sglang is imported inside the tests: importing it while collecting would import triton before
# tests/kernels sets TRITON_INTERPRET.


class DraftSetupReached(Exception):
    pass


def _worker(cap: int, *, probe=None, per_step_width: bool = True):
    """An EchoDraftWorker with just the state draft() reads (no model, no pools): sglang's half set
    by hand, ECHO's an EchoSession as after start-up (ragged verify, ``cap`` from the cost budget)."""
    from sglang_echo.integration.draft_worker import EchoDraftWorker

    cfg = load_config(environ={"SGLANG_ECHO_POLICY": "echo", "SGLANG_ECHO_K_MAX": "64"})
    echo = object.__new__(EchoSession)
    echo.cfg, echo.policy, echo.width, echo.device = cfg, make_echo_policy(cfg), cfg.resolved_width(), "cpu"
    echo.kmax, echo.budget, echo.probe = None, SimpleNamespace(cap=lambda bs: cap), probe
    echo.verify, echo.ragged_graphs, echo.per_step_width = "ragged", False, per_step_width
    echo.metrics, echo.guard, echo.sync = EchoMetrics(64, enabled=False), DraftGuard(100), lambda: None
    w = object.__new__(EchoDraftWorker)
    w.echo, w.step_drafter, w.echo_step, w.echo_backlog = echo, None, StepRecord(), None
    w.speculative_num_steps, w.topk, w.device = cfg.max_depth, max(2, cfg.w_max), "cpu"
    w.req_to_token_pool, w.draft_runner = None, None
    w.target_worker = SimpleNamespace(
        model_runner=SimpleNamespace(attn_backend=SimpleNamespace(verify_mask=None), kv_index_translator=None)
    )
    return w


def _batch(bs: int):
    return SimpleNamespace(
        forward_mode=SimpleNamespace(is_idle=lambda: False),
        seq_lens=torch.tensor([5, 9, 3, 12][:bs]),
        spec_info=SimpleNamespace(bonus_tokens=torch.tensor([[11], [12], [13], [14]][:bs])),
        reqs=[SimpleNamespace(rid=f"r{i}", output_ids=[], customized_info=None) for i in range(bs)],
    )


@pytest.fixture
def no_draft_setup(monkeypatch):
    def reached(*_, **__):
        raise DraftSetupReached

    from sglang_echo.integration import draft_worker

    monkeypatch.setattr(draft_worker, "prepare_for_draft", reached)


def test_a_step_capped_at_its_roots_skips_the_draft_setup(no_draft_setup):
    w, batch = _worker(cap=4), _batch(4)
    assert w.plain_step(4, 4)
    vi = w.draft(batch)
    assert vi.draft_token_num == 1 and vi.spec_steps == 0
    assert vi.draft_token.tolist() == [11, 12, 13, 14] and vi.positions.tolist() == [5, 9, 3, 12]
    assert vi.custom_mask.all() and vi.retrieve_next_token.eq(-1).all()
    assert getattr(vi, MARK, None) is None  # every K_i = W_s = 1: the dense layout is the ragged one
    st = w.echo_step
    assert st.verified == 4 and st.width == 1 and st.draft_forwards == 0 and st.depths.tolist() == [0] * 4
    assert st.timed and st.control_s >= 0 and st.draft_s >= 0


@pytest.mark.parametrize("case", ["room to draft", "probe records trees", "fixed width W"])
def test_other_steps_take_the_full_path(no_draft_setup, case):
    """A cap above the roots, the calibration probe or a step laid out W wide (CUDA graphs) all
    need the policy's trees: those steps reach sglang's draft setup."""
    w = {
        "room to draft": lambda: _worker(cap=5),
        "probe records trees": lambda: _worker(cap=4, probe=object()),
        "fixed width W": lambda: _worker(cap=4, per_step_width=False),
    }[case]()
    with pytest.raises(DraftSetupReached):
        w.draft(_batch(4))
