"""ECHO's speculative worker for sglang 0.5.23 with a draft head (EAGLE-3, DART, DFlash).

:class:`EchoWorker` is sglang's ``EAGLEWorkerV2`` (the same prefill, draft extend, verify, overlap
and idle handling) built around ECHO's own draft worker:

* **Construction.** ``EAGLEWorkerV2.__init__`` builds a plain ``EagleDraftWorker`` with no seam to
  build another, so :meth:`EchoWorker.__init__` sets the same state it sets
  (:data:`~.compat.EAGLE_WORKER_INIT_ATTRS`; the start-up check refuses an sglang whose constructor
  sets anything else) and builds :class:`~.draft_worker.EchoDraftWorker` where sglang builds its
  own, with the worker's :class:`~.session.EchoSession` and the drafter's
  :class:`~.drafting.StepDrafter`. Nothing of sglang's is built twice or patched afterwards.
* **The step.** ``draft()`` builds the policy's trees (:mod:`.draft_worker`); :meth:`EchoWorker.verify`
  runs sglang's verify with ``topk >= 2`` (branched accepted paths compacted to the front) at the
  step's width, and hands the result to the session's epilogue (``cap_lens = K_i``, the budget check,
  the metrics); :meth:`EchoWorker.forward_batch_generation` times each decode step whole and closes
  it (timing, the cost budget).
* **Start-up.** Once the target's attention backend and CUDA graphs exist
  (:meth:`EchoWorker.init_cuda_graphs`), the session settles ragged or padded verify
  (:mod:`.ragged`) and its cost budget, and whether steps are laid out ``max K_i`` wide.
* **Timing** (:mod:`.metrics`): ``verify()`` times the verify pass, ``forward_batch_generation`` the
  whole decode step (``echo_step_seconds``).
"""

from __future__ import annotations

import logging
import time

import torch
from sglang.srt.environ import envs
from sglang.srt.runtime_context import get_device, get_schedule, get_spec
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.eagle_worker_common import run_eagle_verify
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_utils import get_plan_stream

from .draft_worker import EchoDraftWorker
from .drafting import make_step_drafter
from .ragged import target_tokens
from .session import AcceptanceObservers, EchoSession
from .simulate import start as start_simulation

log = logging.getLogger(__name__)


class EchoWorker(AcceptanceObservers, EAGLEWorkerV2):
    """``EAGLEWorkerV2`` running ECHO (or any core policy), ragged or padded-dense verify."""

    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        BaseSpecWorker.__init__(self)
        spec = get_spec()
        vocab = target_worker.model_runner.model_config.vocab_size
        self.echo = EchoSession(
            server_args,
            steps=spec.speculative_num_steps,
            topk=spec.speculative_eagle_topk,
            num_draft_tokens=spec.speculative_num_draft_tokens,
            device=get_device().device,
            vocab_size=vocab,
            draft_path=server_args.speculative_draft_model_path,
        )
        # EAGLEWorkerV2.__init__'s state (compat.EAGLE_WORKER_INIT_ATTRS), its draft worker ours.
        self.server_args = server_args
        self.topk = spec.speculative_eagle_topk
        self.speculative_num_steps = spec.speculative_num_steps
        self.speculative_num_draft_tokens = spec.speculative_num_draft_tokens
        self.gpu_id = gpu_id
        self.device = get_device().device
        self._target_worker = target_worker
        self.page_size = get_schedule().page_size
        self.speculative_algorithm = SpeculativeAlgorithm.from_string(spec.speculative_algorithm)
        self.enable_dp_spec_prefill_coordination = envs.SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION.get()
        self._hosts_draft = True  # one pipeline stage: ECHO refuses --pp-size > 1 (spec.validate_server_args)
        self._draft_worker = EchoDraftWorker(
            server_args,
            gpu_id,
            nccl_port,
            target_worker,
            echo=self.echo,
            step_drafter=make_step_drafter(self.echo.cfg.drafter),
        )
        self.adaptive_controller = None  # ECHO refuses --speculative-adaptive (it adapts per step itself)
        self.num_new_pages_per_topk = torch.empty((), dtype=torch.int64, device=self.device)
        self.extend_lens = torch.empty((), dtype=torch.int64, device=self.device)
        self.plan_stream, self.plan_stream_ctx = get_plan_stream(self.device)
        start_simulation(self.echo.cfg.drafter, vocab, self.device)
        log.info("ECHO worker: policy %s (%s)", self.echo.policy.name, self.echo.cfg.describe())

    def init_cuda_graphs(self):
        """sglang's, then ragged or padded verify (.ragged.resolve_verify_mode) and the step's
        width, once the target's backend and its CUDA graphs exist (the scheduler captures the
        target's graphs after every backend is built)."""
        super().init_cuda_graphs()
        target = self.target_worker.model_runner
        graphs = target.decode_cuda_graph_runner
        ragged = self.echo.settle_verify(target.attn_backend, graphs)
        self.echo.ragged_graphs = ragged and graphs is not None
        log.info("ECHO worker: %s verify, %s budget", self.echo.verify, self.echo.cfg.budget)
        # A graph captured for W (the target's verify, the draft extend's) replays W-wide steps only.
        self.echo.per_step_width = (
            ragged and graphs is None and self._draft_worker.cuda_graph_runner_for_draft_extend is None
        )
        log.info("ECHO worker: verify width %s", self.echo.describe_width())

    def forward_batch_generation(self, batch, *args, **kwargs):
        """EAGLEWorkerV2's step; decode steps are timed whole (``echo_step_seconds``), and prefills
        too while a cost budget runs (what it charges drafting for prefills: ``EchoSession.on_prefill``)."""
        prefill = batch.forward_mode.is_extend()
        if (
            getattr(batch, "is_extend_in_batch", False)
            or batch.forward_mode.is_idle()
            or (prefill and self.echo.budget is None)
        ):
            return super().forward_batch_generation(batch, *args, **kwargs)
        t0 = time.perf_counter()
        result = super().forward_batch_generation(batch, *args, **kwargs)
        self.echo.sync()
        step_s = time.perf_counter() - t0
        if prefill:
            self.echo.on_prefill(len(batch.extend_lens), step_s)
        elif (st := self._draft_worker.echo_step).timed:  # this step drafted (and verified) real trees
            self.echo.on_step_end(st, step_s)
        return result

    def verify(self, batch, pp_proxy_tensors=None, grammar_barrier=None):
        st = self._draft_worker.echo_step
        if batch.forward_mode.is_idle() or st.sizes is None:
            return self._verify(batch, pp_proxy_tensors, grammar_barrier)
        graphs = self.target_worker.model_runner.decode_cuda_graph_runner
        st.forward_tokens = target_tokens(self.echo.verify, st.sizes, st.width, graphs, st.verified)
        with self.echo.timed_verify(st):
            result = self._verify(batch, pp_proxy_tensors, grammar_barrier)
        self.echo.on_verified(result, st)
        return result

    def _verify(self, batch, pp_proxy_tensors, grammar_barrier):
        width = batch.spec_info.draft_token_num  # W, or this step's W_s (EchoDraftWorker.step_width)
        return run_eagle_verify(
            batch,
            pp_proxy_tensors=pp_proxy_tensors,
            target_worker=self.target_worker,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.token_to_kv_pool_allocator,
            plan_stream=self.plan_stream,
            plan_stream_ctx=self.plan_stream_ctx,
            topk=max(2, self.topk),  # >= 2: branched accepted paths get compacted to the front
            num_draft_tokens=width,
            device=self.device,
            metadata_ready_pre_pad=False,
            finalize_tree_path=width > 1,  # compacts accepted branches to the front: nothing to move at W_s = 1
            grammar_barrier=grammar_barrier,
        )
