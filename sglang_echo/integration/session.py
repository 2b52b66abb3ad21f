"""What both ECHO workers run around sglang's step, whatever the drafter: one :class:`EchoSession`.

A session is one worker's ECHO state for the server's lifetime, built from the ECHO settings and
sglang's speculative flags: the validated :class:`~.config.EchoConfig`, the batch's cap ``K_max``
(Eq. 4), the policy, the padded width ``W``, the ``echo_*`` metrics, the calibration probe, the
drafter fault guard (:mod:`.faults`) and the timing sync (:mod:`.metrics`). Once the target's
attention backend (and its CUDA graphs) exist, :meth:`EchoSession.settle_verify` decides ragged or
padded verify (:mod:`.ragged`) and builds the cost budget for it (``budget: cost``).

Each decode step is one :class:`StepRecord`: the drafting half fills it (``K_i``, the cap, the
width, the gates, the timings) and the shared epilogue reads it:

* :meth:`EchoSession.on_verified`, right after the target's verify: ``cap_lens = K_i`` on sglang's
  result (its ``spec_cap_length`` series), the budget check (``sum K_i <= max(cap, bs)``, Eq. 4) and
  the step's metrics;
* :meth:`EchoSession.on_step_end`, after the whole step: its timing, and the cost budget's
  ``observe_step`` (its decision exported per arm and reason);
* :meth:`EchoSession.on_prefill`, after a prefill batch: its time, for the cost budget;
* :meth:`EchoSession.on_accept` (through :class:`AcceptanceObservers`, mixed into both workers): the
  accepted lengths sglang hands to the host, to the metrics, the cost budget and the probe.

The EAGLE worker (:mod:`.worker`) and the n-gram worker (:mod:`.ngram_worker`) both compose one
session, so what a step reports does not depend on which sglang worker ran it.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Optional

import torch

from sglang_echo.calibration.probe import ProbeRecorder
from sglang_echo.core.tree import NodePool

from .config import (
    check_consistent,
    load_config,
    make_echo_policy,
    make_step_budget,
    resolve_control_kernel,
    server_kmax,
)
from .faults import DraftGuard
from .metrics import EchoMetrics, timing_sync
from .ragged import VerifyMode, resolve_verify_mode
from .served_calibration import load_calibration_for

log = logging.getLogger(__name__)


@dataclass
class StepRecord:
    """One decode step, from its drafting to the epilogue (what :meth:`EchoMetrics.on_step`,
    :meth:`EchoMetrics.check_budget` and the cost budget read)."""

    sizes: Optional[torch.Tensor] = None  # [bs] int32 K_i, roots included (None: nothing drafted yet)
    verified: int = 0  # sum K_i, roots included
    gate_evaluated: Optional[torch.Tensor] = None
    gate_passed: Optional[torch.Tensor] = None
    draft_forwards: int = 0
    ngram_nodes: int = 0  # hybrid: the nodes the requests' n-gram drafters added (.hybrid)
    pool: Optional[NodePool] = None  # every drafted candidate (the calibration probe reads it)
    depths: Optional[torch.Tensor] = None  # [bs] deepest node of each request's tree
    cap: Optional[int] = None  # this step's verification cap, roots included (None: an idle step)
    width: int = 0  # the step's padded verify width (W, or W_s = max K_i: core.dense.step_width)
    forward_tokens: int = 0  # tokens the target's verify forward computed
    timed: bool = False  # drafted (and timed) by the EAGLE draft worker; cleared by the epilogue
    # Wall seconds (see .metrics): control = build_trees minus propose, plus packing.
    control_s: float = 0.0
    propose_s: float = 0.0  # inside the drafter's propose
    draft_s: float = 0.0  # the drafting phase minus control_s
    verify_s: float = 0.0
    prepare_s: float = 0.0  # n-gram worker: its whole drafting phase (_prepare_draft_tokens)


class EchoSession:
    """One ECHO worker's settings, policy, cap, metrics, probe, fault guard and cost budget, and the
    step epilogue (module docstring)."""

    def __init__(
        self,
        server_args,
        *,
        steps: int,
        topk: int,
        num_draft_tokens: int,
        device,
        vocab_size: int,
        control_device=None,
        draft_path: Optional[str] = None,
    ) -> None:
        """``steps``, ``topk``, ``num_draft_tokens``: sglang's resolved speculative flags (they must
        be what :func:`.spec.handle_server_args` set); ``device``: the worker's; ``control_device``:
        where the policy's trees are built (default ``device``; the n-gram drafter builds them on the
        host); ``draft_path``: the head a calibration file must have been made for."""
        cfg = load_config(num_steps=steps, topk=topk, num_draft_tokens=num_draft_tokens)
        check_consistent(cfg, steps, topk, num_draft_tokens)
        calib = load_calibration_for(cfg, model_path=server_args.model_path, draft_path=draft_path)
        self.cfg = cfg = resolve_control_kernel(cfg, device if control_device is None else control_device)
        self.device = device
        self.kmax = server_kmax(cfg, calib, device)
        self.policy = make_echo_policy(cfg, calib, self.kmax)
        self.width = cfg.resolved_width()
        self.metrics = EchoMetrics(self.kmax.flat, enabled=bool(getattr(server_args, "enable_metrics", False)))
        self.guard = DraftGuard(vocab_size, self.metrics.draft_fault)
        self.probe = ProbeRecorder.from_env(device)
        self.sync = timing_sync(device)
        # Settled once the target's backend and graphs exist (settle_verify; the workers' layout):
        self.verify: str = VerifyMode.PADDED.value
        self.budget = None  # budget cost: the CostModelBudget choosing each step's cap
        self.ragged_graphs = False  # the target replays ragged verify as token-tier CUDA graphs
        self.per_step_width = False  # lay each step out max K_i wide (nothing captured for W)

    # -- settled at start-up -----------------------------------------------------------------
    def settle_verify(self, attn_backend, graph_runner=None) -> bool:
        """Ragged or padded verify (:func:`.ragged.resolve_verify_mode`) for the target's backend and
        graphs, and the cost budget for it (its model needs true device times: the sync is forced
        then). Returns whether verify is ragged."""
        self.verify = resolve_verify_mode(self.cfg.verify, attn_backend, graph_runner)
        ragged = self.verify == VerifyMode.RAGGED
        self.budget = make_step_budget(self.cfg, self.policy, None if ragged else self.width, self.kmax)
        if self.budget is not None:
            self.sync = timing_sync(self.device, force=True)
        return ragged

    def describe_width(self) -> str:
        return "per step (max K_i)" if self.per_step_width else f"{self.width}"

    # -- each step ---------------------------------------------------------------------------
    def step_cap(self, bs: int) -> int:
        """This step's verification cap, roots included: the cost budget's choice, else ``K_max(bs)``."""
        return self.kmax(bs) if self.budget is None else self.budget.cap(bs)

    def may_draft(self, cap: int, bs: int) -> bool:
        """Whether a step capped at ``cap`` can have drafts: a budgeted policy's cap (``sum K_i <=
        max(cap, bs)``) must exceed the roots."""
        return not self.policy.budgeted or cap > bs

    @contextmanager
    def timed_verify(self, st: StepRecord):
        """Times the verify pass run inside into ``st.verify_s`` (and the probe's row: its
        ``verify_tokens`` are ``st.forward_tokens``)."""
        timing = nullcontext() if self.probe is None else self.probe.timed_verify(st.forward_tokens)
        t0 = time.perf_counter()
        with timing:
            yield
        self.sync()
        st.verify_s = time.perf_counter() - t0

    def on_verified(self, result, st: StepRecord) -> None:
        """After the target verified the step's trees: ``cap_lens = K_i`` on sglang's result, the
        budget check and the step's metrics (``st.forward_tokens`` set)."""
        result.cap_lens = st.sizes.to(self.device)
        self.metrics.check_budget(self.policy, st)
        self.metrics.on_step(st, st.forward_tokens)

    def on_step_end(self, st: StepRecord, step_s: float) -> None:
        """After the whole decode step (``step_s`` wall seconds): its timing, and what the cost
        budget learns from it (``st.verify_s`` and ``st.forward_tokens`` set)."""
        st.timed = False
        self.metrics.on_timing(control=st.control_s, draft=st.draft_s, verify=st.verify_s, step=step_s)
        if self.budget is not None:
            decision = self.budget.observe_step(
                batch_size=st.sizes.numel(),
                target_tokens=st.forward_tokens,
                verified_tokens=st.verified,
                draft_forwards=st.draft_forwards,
                draft_s=st.draft_s + st.control_s,
                verify_s=st.verify_s,
                step_s=step_s,
                cap=st.cap,
            )
            self.metrics.on_budget_step(decision, step_s, self.budget.last_premium)
            if decision is not None and decision[1] == "explore":  # rare: every explore_every+ steps
                log.info("ECHO cost budget after exploring: %s", self.budget.explain(st.sizes.numel()))

    def on_prefill(self, requests: int, seconds: float) -> None:
        """A prefill batch of ``requests`` new requests took ``seconds`` (the device synced): what
        the cost budget charges drafting for requests prefilled apart (:mod:`sglang_echo.core.prefill_share`)."""
        if self.budget is not None:
            self.budget.observe_prefill(requests, seconds)

    def on_accept(self, num_correct_drafts_per_req) -> None:
        """The step's accepted drafts per request, as sglang hands them to the host."""
        self.metrics.on_accept(num_correct_drafts_per_req)
        if self.budget is not None:
            self.budget.observe_accept(num_correct_drafts_per_req)
        if self.probe is not None:
            self.probe.on_accept(num_correct_drafts_per_req)


class AcceptanceObservers:
    """Mixed into both ECHO workers, before sglang's worker class: sglang hands every step's
    accepted draft counts to the host through ``on_verify_complete_cpu``; the worker's
    :class:`EchoSession` (``self.echo``) passes them on."""

    echo: EchoSession

    def on_verify_complete_cpu(self, num_correct_drafts_per_req, batch_size: int = 0) -> None:
        super().on_verify_complete_cpu(num_correct_drafts_per_req, batch_size)
        self.echo.on_accept(num_correct_drafts_per_req)
