"""ECHO's draft step inside sglang's EAGLE draft worker: :class:`EchoDraftWorker`.

:class:`EchoDraftWorker` is a plain subclass of sglang's ``EagleDraftWorker``, built by
:class:`~.worker.EchoWorker` where sglang builds its own, with the worker's
:class:`~.session.EchoSession` (``self.echo``) and the drafter's :class:`~.drafting.StepDrafter`
(``self.step_drafter``). Its :meth:`~EchoDraftWorker.draft` runs the core's ``build_trees`` loop
with any core policy (``echo`` and every baseline): the step drafter's frontier drafter proposes
the children of the frontier the policy picked, the policy keeps the nodes (ECHO Alg. 1 under
``sum K_i <= max(K_max, bs)``, Eq. 4), and the trees are packed into sglang's padded layout
(:func:`~sglang_echo.core.dense.to_sglang_dense`) as an :class:`EchoVerifyInput` for sglang's
unchanged verify. Every sglang stage that differs between drafters (LM head, CUDA graphs, the
draft extends after a prefill and after a verify) goes to the step drafter; sglang's own stages
stay reachable as ``eagle_*`` for the drafters that keep them.

* Ragged verify (:mod:`.ragged`, where the attention backend supports it): the verify input also
  carries ``K``, and the target forward runs on the ``sum K_i`` real nodes only; sglang's
  acceptance and KV commit still see the padded layout.
* Per-step width (ragged verify without CUDA graphs captured for ``W``): the step is laid out
  ``W_s = max K_i`` wide (:meth:`EchoDraftWorker.step_width`), for verify, acceptance and the draft
  extend alike, so a step without drafts costs about a plain decode step: ``B x 1`` verify slots and
  a ``B``-token draft extend instead of ``B x W`` of each.
* Plain steps (:meth:`EchoDraftWorker.plain_step`): a step whose cap leaves no room for drafts skips
  the draft setup and the policy's loop and packs its roots directly (:func:`~sglang_echo.core.
  dense.plain_dense`).
* Hybrid drafting (:mod:`.hybrid`, ``hybrid``): the step drafter's frontier drafter and each
  request's n-gram drafter propose into the same trees.
* Lazy extend (:mod:`.lazy_extend`, ``lazy_extend``, drafters that draft from EAGLE's draft
  extend): a plain step (every ``K_i = 1``) skips the draft extend and keeps its pairs, and so
  does a prefill whose new tokens and replies fit the backlog on a server without the radix cache
  (:func:`.lazy_extend.prefills_may_wait`); the next step that may draft
  extends over them first, so runs of plain steps cost about a plain decode step.
* Timing (:mod:`.metrics`): :meth:`~EchoDraftWorker.draft` splits its wall time into control
  (``build_trees`` minus the drafter's ``propose``, plus packing) and drafting.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Optional

import torch
from sglang.srt.speculative.eagle_info import EagleDraftInput, EagleVerifyInput
from sglang.srt.speculative.eagle_utils import TreeMaskMode, get_draft_recurrent_hidden_state_spec
from sglang.srt.speculative.eagle_worker_common import prepare_for_draft
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

from sglang_echo.core.dense import plain_dense, step_width, to_sglang_dense
from sglang_echo.drafters.hybrid import NGRAM

from .drafting import StepDrafter
from .hybrid import RequestNgrams
from .lazy_extend import (
    DraftBacklog,
    catch_up,
    defer_extend,
    defer_prefill,
    lazy_extend_applies,
    pool_slots,
    prefills_may_wait,
    root_positions,
)
from .metrics import TimedDrafter
from .ragged import VerifyMode, mark_verify
from .session import EchoSession, StepRecord

log = logging.getLogger(__name__)


class EchoVerifyInput(EagleVerifyInput):
    """An EAGLE verify input whose tree is irregular: ``tree_topk = -1`` makes the CPU attention
    backends use the mask and the kernels treat the tree as arbitrary (as NGRAM does)."""

    echo_verify_lens: Optional[torch.Tensor] = None  # [bs] K_i: ragged verify (see .ragged.MARK)

    @property
    def tree_topk(self) -> int:
        return -1


class EchoDraftWorker(EagleDraftWorker):
    """sglang's EAGLE draft worker drafting ECHO trees (module docstring)."""

    # sglang's own stages, which StepDrafter's defaults run (drafters on EAGLE's draft layer).
    eagle_init_lm_head = EagleDraftWorker.init_lm_head
    eagle_extend_for_prefill = EagleDraftWorker._draft_extend_for_prefill
    eagle_extend_for_decode = EagleDraftWorker._draft_extend_for_decode

    def __init__(self, server_args, gpu_id, nccl_port, target_worker, *, echo: EchoSession, step_drafter: StepDrafter):
        self.echo = echo
        self.step_drafter = step_drafter
        self.echo_step = StepRecord()  # this step's, from draft() to the step's epilogue
        self.echo_backlog: Optional[DraftBacklog] = None  # lazy extend: allocated with the pools
        self.echo_ngrams = RequestNgrams() if echo.cfg.hybrid else None  # hybrid drafting (.hybrid)
        step_drafter.register_model()
        super().__init__(server_args, gpu_id, nccl_port, target_worker)  # loads the draft model
        # ECHO drafts eagerly (its frontier drafters): EAGLE's draft-decode graph is never replayed.
        self.cuda_graph_runner = None
        self.lazy_extend = step_drafter.drafts_from_extend and lazy_extend_applies(server_args, echo.cfg)
        self.lazy_prefill = self.lazy_extend and prefills_may_wait(server_args)
        step_drafter.attach(self)

    # -- the step drafter's stages -------------------------------------------------------------
    def alloc_memory_pool(self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None):
        super().alloc_memory_pool(
            memory_pool_config=memory_pool_config,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=token_to_kv_pool_allocator,
        )
        if self.lazy_extend:  # one backlog row per request slot
            self.echo_backlog = DraftBacklog(
                req_to_token_pool.req_to_token.shape[0], self.device, capacity=self.echo.cfg.lazy_extend
            )

    def init_lm_head(self):
        self.step_drafter.init_lm_head(self)

    def _capture_cuda_graphs(self):
        self.cuda_graph_runner = self.cuda_graph_runner_for_draft_extend = None
        if self.step_drafter.draft_graphs:
            super()._capture_cuda_graphs()

    def _draft_extend_for_prefill(
        self, batch, target_hidden_states, next_token_ids, mm_input_embeds=None, kv_loc_plan=None
    ):
        if self.echo_backlog is not None and not batch.forward_mode.is_idle():
            self.echo_backlog.clear(pool_slots(batch))  # a new request in the slot
            if self.lazy_prefill:
                deferred = defer_prefill(self, batch, target_hidden_states, next_token_ids, mm_input_embeds)
                if deferred is not None:
                    return deferred
        return self.step_drafter.extend_for_prefill(
            self, batch, target_hidden_states, next_token_ids, mm_input_embeds, kv_loc_plan
        )

    def _draft_extend_for_decode(self, batch, batch_result, *, kv_loc_plan=None):
        st = self.echo_step
        if (
            self.echo_backlog is not None
            and not batch.forward_mode.is_idle()
            and st.sizes is not None
            and st.verified == st.sizes.numel()
        ):  # a plain step: every K_i = 1
            return defer_extend(self, batch, batch_result)
        with self.width_for(batch_result.speculative_num_draft_tokens or self.speculative_num_draft_tokens):
            return self.step_drafter.extend_for_decode(self, batch, batch_result, kv_loc_plan)

    def placeholder_draft_input(self, bonus_tokens) -> EagleDraftInput:
        """The between-steps state EAGLE's plumbing relays, zeroed (children of probability 0, never
        proposed): for a drafter that reads only the bonus tokens, and for a lazy-extend request,
        whose children its catch-up computes."""
        bs = bonus_tokens.shape[0]
        H, dtype = get_draft_recurrent_hidden_state_spec(self.draft_runner)
        return EagleDraftInput(
            topk_p=torch.zeros(bs, self.topk, device=self.device),
            topk_index=torch.zeros(bs, self.topk, dtype=torch.int64, device=self.device),
            hidden_states=torch.zeros(bs, H, dtype=dtype, device=self.device),
            bonus_tokens=bonus_tokens,
            num_tokens_per_req=1,
            num_tokens_for_logprob_per_req=1,
        )

    def relay_placeholders(self, nxt) -> None:
        """Zero the state the draft extend would have set on the next step's draft input."""
        fresh = self.placeholder_draft_input(nxt.bonus_tokens)
        nxt.topk_p, nxt.topk_index, nxt.hidden_states = fresh.topk_p, fresh.topk_index, fresh.hidden_states

    def record_lazy(self, **tokens: int) -> None:
        """Tokens the lazy extend deferred or caught up (``echo_*_tokens_total``)."""
        self.echo.metrics.on_lazy_extend(**tokens)

    # -- the step's layout ---------------------------------------------------------------------
    def step_width(self, sizes: torch.Tensor) -> int:
        """This step's padded verify width: ``W``, or ``W_s = max K_i`` where every stage sizes
        itself from the step (no CUDA graph captured for ``W``; ragged verify).

        sglang's V2 step reads the width from the verify input (``draft_token_num``: the verify
        slots, and ``EchoWorker._verify`` passes it on to acceptance and the result's output
        stride, which the scheduler reads) and from ``speculative_num_draft_tokens`` (the draft
        extend, set per step by :meth:`width_for`), as sglang's adaptive steps=0 path does for its
        one-token verify."""
        return step_width(sizes, self.echo.width, self.echo.per_step_width)

    @contextmanager
    def width_for(self, width: int):
        """``speculative_num_draft_tokens = width`` for the step's draft extend."""
        saved, self.speculative_num_draft_tokens = self.speculative_num_draft_tokens, width
        try:
            yield
        finally:
            self.speculative_num_draft_tokens = saved

    def plain_step(self, cap: int, bs: int) -> bool:
        """A step that cannot draft and is laid out 1 wide: its verify input is built directly
        (:func:`~sglang_echo.core.dense.plain_dense`), skipping the draft setup (the draft tokens'
        KV slots, the draft attention metadata, the drafter) and the policy's loop, so that such a
        step costs about a plain decode step. The calibration probe records every step's trees: it
        keeps the full path."""
        echo = self.echo
        return echo.per_step_width and echo.probe is None and not echo.may_draft(cap, bs)

    # -- the draft step ------------------------------------------------------------------------
    def draft(self, batch, *, with_topology: bool = False):
        if with_topology:
            raise NotImplementedError("ECHO does not support pipeline parallelism (pp_size > 1)")
        echo = self.echo
        t_entry = time.perf_counter()
        st = self.echo_step = StepRecord()
        if batch.forward_mode.is_idle():
            self._prepare_draft(batch)
            st.sizes = torch.zeros(0, dtype=torch.int32, device=self.device)
            return EchoVerifyInput.create_idle_input(self.topk, self.speculative_num_steps, echo.width, self.device)
        bs = batch.seq_lens.shape[0]
        roots = batch.spec_info.bonus_tokens.reshape(bs).long()
        verify_mask, full_mask = self._verify_mask()
        st.cap = echo.step_cap(bs)
        kv_loc_plan, trees, state = None, None, None
        if self.plain_step(st.cap, bs):
            t_build = t_pack = time.perf_counter()  # control: the packing below
            st.sizes, propose_s = torch.ones(bs, dtype=torch.int32, device=self.device), 0.0
        else:
            forward_batch, kv_loc_plan = self._prepare_draft(batch)
            if self.echo_backlog is not None and echo.may_draft(st.cap, bs):
                self.record_lazy(caught_up=catch_up(self, batch, batch.spec_info, self.echo_backlog))
            frontier = self.step_drafter.frontier(self, batch, forward_batch, roots)
            if self.echo_ngrams is not None:  # hybrid: the requests' n-gram drafters draft too
                frontier = self.echo_ngrams.hybrid(frontier, batch.reqs, roots)
            drafter = TimedDrafter(frontier, echo.sync)
            echo.sync()
            t_build = time.perf_counter()
            trees, state, _ = echo.guard.build(echo.policy, drafter, roots, st.cap)
            t_pack = time.perf_counter()  # control: [t_build, t_pack) minus propose, then packing
            st.sizes, propose_s = trees.sizes.to(torch.int32), drafter.seconds
            st.gate_evaluated, st.gate_passed = state.gate_evaluated, state.gate_passed
            st.draft_forwards = drafter.forwards
            if self.echo_ngrams is not None:
                st.ngram_nodes = int((trees.drafter == NGRAM).sum())
        st.verified = int(st.sizes.sum())
        st.width = width = self.step_width(st.sizes)
        dense = (
            plain_dense(roots, batch.seq_lens, full_mask)
            if trees is None
            else to_sglang_dense(trees, batch.seq_lens, width, full_mask=full_mask)
        )
        verify_input = self._verify_input(dense, width, verify_mask, bs, kv_loc_plan)
        if echo.verify == VerifyMode.RAGGED:  # see .ragged.mark_verify
            mark_verify(verify_input, st.sizes, st.verified, width, always=echo.ragged_graphs)
        echo.sync()
        t_end = time.perf_counter()
        st.propose_s = propose_s
        st.control_s = (t_pack - t_build - propose_s) + (t_end - t_pack)
        st.draft_s = (t_end - t_entry) - st.control_s
        st.timed = True
        # Bookkeeping outside the timed phases (it is in the step time): per-request depths, probe.
        st.depths = torch.zeros(bs, dtype=torch.int64, device=self.device) if trees is None else trees.max_depth()
        echo.metrics.on_tree_depths(batch.reqs, st.depths)
        if echo.probe is not None:
            echo.probe.on_draft(
                state.pool, echo.policy.max_depth, [r.rid for r in batch.reqs], root_positions(batch).tolist()
            )
        return verify_input

    def _prepare_draft(self, batch):
        """sglang's draft-decode batch (the draft tokens' KV slots) and its KV plan (GPU chains only)."""
        forward_batch, _graph, kv_loc_plan = prepare_for_draft(
            batch.spec_info,
            self.req_to_token_pool,
            batch,
            None,
            self.draft_runner,
            self.topk,
            self.speculative_num_steps,
            target_translator=self.target_worker.model_runner.kv_index_translator,
            num_draft_tokens=self.echo.width,  # the widest layout
        )
        return forward_batch, kv_loc_plan

    def _verify_mask(self):
        """The target backend's preallocated verify mask (None: none) and whether the layout is
        FULL_MASK. A ragged forward reads each request's ``W x W`` tree block, never a FULL_MASK row."""
        verify_mask = self.target_worker.model_runner.attn_backend.verify_mask
        if verify_mask is not None:
            mode = verify_mask.mode
        else:
            mode = TreeMaskMode.QLEN_ONLY if self.echo.verify == VerifyMode.RAGGED else self.tree_mask_mode
        if mode not in (TreeMaskMode.QLEN_ONLY, TreeMaskMode.FULL_MASK):
            raise NotImplementedError(f"ECHO: tree mask mode {mode} is not supported yet")
        return verify_mask, mode == TreeMaskMode.FULL_MASK

    def _verify_input(self, dense, width: int, verify_mask, bs: int, kv_loc_plan) -> EchoVerifyInput:
        """sglang's verify input for the packed trees (the mask copied into a preallocated buffer)."""
        custom_mask = dense.custom_mask
        if verify_mask is not None and verify_mask.fits(bs):  # QLEN_ONLY, or FULL_MASK (padded, CUDA graphs)
            buf = verify_mask.buffer.view(-1)[: custom_mask.numel()]
            buf.copy_(custom_mask.to(buf.dtype))
            custom_mask = buf
        verify_input = EchoVerifyInput(
            draft_token=dense.draft_token,
            custom_mask=custom_mask,
            positions=dense.positions,
            retrieve_index=dense.retrieve_index,
            retrieve_next_token=dense.retrieve_next_token,
            retrieve_next_sibling=dense.retrieve_next_sibling,
            retrieve_cum_len=None,
            spec_steps=min(self.speculative_num_steps, width - 1),  # a tree of K nodes is at most K - 1 deep
            topk=self.topk,
            draft_token_num=width,
            capture_hidden_mode=None,
            seq_lens_sum=None,
            seq_lens_cpu=None,
        )
        if kv_loc_plan is not None:
            verify_input.kv_loc_plan = kv_loc_plan
            verify_input.prepared_out_cache_loc = kv_loc_plan.write_virtual
        return verify_input
