"""ECHO's speculative worker for sglang 0.5.23.

* :class:`EchoWorker` is ``EAGLEWorkerV2`` (same prefill, draft extend, verify, overlap and
  idle handling), with the draft worker class-swapped to :class:`EchoDraftWorker` and
  ``verify()`` passing ``topk >= 2`` and reporting ``cap_lens = K_i``.
* :class:`EchoDraftWorker.draft` runs the core's ``build_trees`` loop with any core policy
  (``echo`` and every baseline): the EAGLE-3 draft model drafts depth by depth over the frontier
  the policy picked (:mod:`.drafter`), the policy keeps the nodes (ECHO Alg. 1 under
  ``sum K_i <= max(K_max, bs)``), and the trees are padded to W (:mod:`.padded`) into an
  :class:`EchoVerifyInput` for sglang's unchanged ``verify()``.
* ``drafter: dart`` (:mod:`.dart`): the same step with DART's drafter, one mask forward per step
  over the draft KV the draft extend wrote, ranked by DART's n-gram-enforced COMBINE score.
* ``drafter: dflash`` (:mod:`.dflash`): DFlash's block forward over its context, which the draft
  extends write into the draft KV pool in place of EAGLE's draft-layer forward.
* Ragged verify (:mod:`.ragged`, where the attention backend supports it): the verify input
  also carries ``K``, and the target forward runs on the ``sum K_i`` real nodes only; sglang's
  acceptance and KV commit still see the padded layout.
* ``budget: cost`` (:mod:`sglang_echo.core.budget`): each step's cap comes from a cost model fed
  with the step's timing and acceptance, down to plain decoding where drafting does not pay.
* Per-step width (ragged verify without CUDA graphs): the step is laid out ``W_s = max K_i``
  wide instead of ``W`` (:meth:`EchoDraftWorker.step_width`), for verify, acceptance and the
  draft extend alike, so a step without drafts costs about a plain decode step: ``B x 1``
  verify slots and a ``B``-token draft extend instead of ``B x W`` of each.
* Lazy extend (:mod:`.lazy_extend`, ``lazy_extend``, EAGLE-3 and DART drafters): a plain step
  (every ``K_i = 1``) skips the draft extend and keeps its pairs; the next step that may draft
  extends over them first, so runs of plain steps cost about a plain decode step.
* Plain steps (:meth:`EchoDraftWorker.plain_step`): a step whose cap leaves no room for drafts
  skips the draft setup and the policy's loop and packs its roots directly (:func:`.padded.
  plain_dense`).
* Timing (:mod:`.metrics`): ``draft()`` splits its wall time into control (``build_trees``
  minus the drafter's ``propose``, plus packing) and drafting, ``verify()`` times the verify
  pass, :meth:`EchoWorker.forward_batch_generation` the whole decode step.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager, nullcontext
from typing import Optional

import torch
from sglang.srt.speculative.eagle_info import EagleDraftInput, EagleVerifyInput
from sglang.srt.speculative.eagle_utils import (
    TreeMaskMode,
    get_draft_recurrent_hidden_state_spec,
    per_step_draft_out_cache_loc,
)
from sglang.srt.speculative.eagle_worker_common import prepare_for_draft, run_eagle_verify
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

from sglang_echo.calibration.probe import ProbeRecorder
from sglang_echo.core.dense import plain_dense, step_width, to_sglang_dense

from .config import (
    EchoConfig,
    check_consistent,
    configured_drafter,
    load_calibration_for,
    load_config,
    make_echo_policy,
    make_step_budget,
    resolve_control_kernel,
    server_kmax,
)
from .drafter import EagleFrontierDrafter
from .faults import DraftGuard
from .lazy_extend import DraftBacklog, catch_up, defer_extend, pool_slots, root_positions
from .metrics import AcceptanceObservers, EchoMetrics, TimedDrafter, _noop, timing_sync
from .ragged import mark_verify, resolve_verify_mode, target_tokens
from .simulate import simulated
from .simulate import start as start_simulation

log = logging.getLogger(__name__)


class EchoVerifyInput(EagleVerifyInput):
    """An EAGLE verify input whose tree is irregular: ``tree_topk = -1`` makes the CPU attention
    backends use the mask and the kernels treat the tree as arbitrary (as NGRAM does)."""

    echo_verify_lens: Optional[torch.Tensor] = None  # [bs] K_i: ragged verify (see .ragged.MARK)

    @property
    def tree_topk(self) -> int:
        return -1


class EchoStepState:
    """What the draft step hands to verify and the metrics (per scheduler step)."""

    def __init__(self) -> None:
        self.sizes: Optional[torch.Tensor] = None  # [bs] int32 K_i
        self.verified = 0  # sum K_i, roots included
        self.gate_evaluated: Optional[torch.Tensor] = None
        self.gate_passed: Optional[torch.Tensor] = None
        self.draft_forwards = 0
        self.depths: Optional[torch.Tensor] = None  # [bs] deepest node of each request's tree
        self.cap: Optional[int] = None  # this step's verification cap, roots included (None: an idle step)
        self.width = 0  # this step's padded verify width (W, or W_s = max K_i: see step_width)
        self.forward_tokens = 0  # tokens the target's verify forward computed
        # Wall seconds (see .metrics): set by draft() / verify(), read once by the step.
        self.timed = False
        self.control_s = 0.0
        self.draft_s = 0.0
        self.verify_s = 0.0


class EchoDraftWorker(EagleDraftWorker):
    """Class-swapped in by :class:`EchoWorker`; its extra state lives in ``self.echo_*``."""

    echo_cfg: EchoConfig
    echo_policy = None
    echo_width: int = 0
    echo_ragged: bool = False
    echo_ragged_graphs: bool = False  # the target replays ragged verify as token-tier CUDA graphs
    echo_step: EchoStepState
    echo_probe: Optional[ProbeRecorder] = None
    echo_sync = staticmethod(_noop)  # .metrics.timing_sync(device), set by EchoWorker
    echo_metrics = None  # the EchoWorker's EchoMetrics (per-request tree depths)
    echo_dart = None  # drafter dart: the step's DartSearch (None: EAGLE-3 drafting)
    echo_history = None  # drafter dart: the live requests' committed tokens (TokenHistory)
    echo_drafter: str = "eagle3"
    echo_dflash = None  # drafter dflash: the head and its context in the draft KV pool (DFlashPoolContext)
    echo_budget = None  # budget cost: the CostModelBudget choosing each step's cap
    echo_kmax = None  # the server's KMax: each step's cap under budget fixed, the ceiling under cost
    echo_guard: DraftGuard  # builds the trees; a failing drafter's step is verified as plain decoding
    echo_step_width = False  # lay each step out max K_i wide (set by EchoWorker.init_cuda_graphs)
    echo_backlog: Optional[DraftBacklog] = None  # lazy extend: plain steps' pairs not yet in the draft KV

    def _may_draft(self, cap: int, bs: int) -> bool:
        """Whether this step's trees can have drafts: a budgeted policy's cap (``sum K_i <=
        max(cap, bs)``) must exceed the roots."""
        return not self.echo_policy.budgeted or cap > bs

    def step_cap(self, bs: int) -> int:
        """This step's verification cap, roots included: the cost budget's choice, else ``K_max(bs)``."""
        return self.echo_kmax(bs) if self.echo_budget is None else self.echo_budget.cap(bs)

    def step_width(self, sizes: torch.Tensor) -> int:
        """This step's padded verify width: ``W``, or ``W_s = max K_i`` where every stage sizes
        itself from the step (no CUDA graph captured for ``W``; ragged verify).

        sglang's V2 step reads the width from the verify input (``draft_token_num``: the verify
        slots, and ``EchoWorker._verify`` passes it on to acceptance and the result's output
        stride, which the scheduler reads) and from ``speculative_num_draft_tokens`` (the draft
        extend, set per step by :meth:`width_for`), as sglang's adaptive steps=0 path does for its
        one-token verify."""
        return step_width(sizes, self.echo_width, self.echo_step_width)

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
        (:func:`.padded.plain_dense`), skipping the draft setup (the draft tokens' KV slots, the
        draft attention metadata, the drafter) and the policy's loop, so that such a step costs
        about a plain decode step. The calibration probe records every step's trees: it keeps the
        full path."""
        return self.echo_step_width and self.echo_probe is None and not self._may_draft(cap, bs)

    def draft(self, batch, *, with_topology: bool = False):
        if with_topology:
            raise NotImplementedError("ECHO does not support pipeline parallelism (pp_size > 1)")
        t_entry = time.perf_counter()
        st = self.echo_step = EchoStepState()
        if batch.forward_mode.is_idle():
            self._prepare_draft(batch)
            st.sizes = torch.zeros(0, dtype=torch.int32, device=self.device)
            return EchoVerifyInput.create_idle_input(
                self.topk, self.speculative_num_steps, self.echo_width, self.device
            )
        bs = batch.seq_lens.shape[0]
        roots = batch.spec_info.bonus_tokens.reshape(bs).long()
        verify_mask, full_mask = self._verify_mask()
        st.cap = self.step_cap(bs)
        kv_loc_plan, trees, state = None, None, None
        if self.plain_step(st.cap, bs):
            t_build = t_pack = time.perf_counter()  # control: the packing below
            st.sizes, propose_s = torch.ones(bs, dtype=torch.int32, device=self.device), 0.0
        else:
            forward_batch, kv_loc_plan = self._prepare_draft(batch)
            if self.echo_backlog is not None and self._may_draft(st.cap, bs):
                self._record_lazy(caught_up=catch_up(self, batch, batch.spec_info, self.echo_backlog))
            drafter = TimedDrafter(self._frontier(batch, forward_batch, roots), self.echo_sync)
            self.echo_sync()
            t_build = time.perf_counter()
            trees, state, _ = self.echo_guard.build(self.echo_policy, drafter, roots, st.cap)
            t_pack = time.perf_counter()  # control: [t_build, t_pack) minus propose, then packing
            st.sizes, propose_s = trees.sizes.to(torch.int32), drafter.seconds
            st.gate_evaluated, st.gate_passed = state.gate_evaluated, state.gate_passed
            st.draft_forwards = drafter.forwards
        st.verified = int(st.sizes.sum())
        st.width = width = self.step_width(st.sizes)
        dense = (
            plain_dense(roots, batch.seq_lens, full_mask)
            if trees is None
            else to_sglang_dense(trees, batch.seq_lens, width, full_mask=full_mask)
        )
        verify_input = self._verify_input(dense, width, verify_mask, bs, kv_loc_plan)
        if self.echo_ragged:  # see .ragged.mark_verify
            mark_verify(verify_input, st.sizes, st.verified, width, always=self.echo_ragged_graphs)
        self.echo_sync()
        t_end = time.perf_counter()
        st.control_s = (t_pack - t_build - propose_s) + (t_end - t_pack)
        st.draft_s = (t_end - t_entry) - st.control_s
        st.timed = True
        # Bookkeeping outside the timed phases (it is in the step time): per-request depths, probe.
        st.depths = torch.zeros(bs, dtype=torch.int64, device=self.device) if trees is None else trees.max_depth()
        if self.echo_metrics is not None:
            self.echo_metrics.on_tree_depths(batch.reqs, st.depths)
        if self.echo_probe is not None:
            self.echo_probe.on_draft(
                state.pool, self.echo_policy.max_depth, [r.rid for r in batch.reqs], root_positions(batch).tolist()
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
            num_draft_tokens=self.echo_width,  # the widest layout
        )
        return forward_batch, kv_loc_plan

    def _frontier(self, batch, forward_batch, roots):
        """The configured drafter's side of the core's drafter protocol, for this step."""
        bs, draft_input = roots.numel(), batch.spec_info
        if self.echo_dart is not None:
            from .dart import DartFrontierDrafter

            return DartFrontierDrafter(self, batch, draft_input, self.echo_dart, self.echo_history)
        if self.echo_dflash is not None:
            from .dflash import DFlashFrontierDrafter

            return DFlashFrontierDrafter(self, batch, roots, self.echo_dflash)
        steps = self.speculative_num_steps
        if self.echo_policy.max_depth > 1 and steps > 1:
            self.draft_attn_backend.init_forward_metadata(forward_batch)
            forward_batch.mark_forward_metadata_ready()
        out_cache_loc = per_step_draft_out_cache_loc(forward_batch.out_cache_loc, bs, self.topk, steps)
        return simulated(EagleFrontierDrafter(self, forward_batch, draft_input, out_cache_loc), batch, roots)

    def _verify_mask(self):
        """The target backend's preallocated verify mask (None: none) and whether the layout is FULL_MASK."""
        verify_mask = self.target_worker.model_runner.attn_backend.verify_mask
        mode = self.tree_mask_mode if verify_mask is None else verify_mask.mode
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

    # -- drafter dflash: DFlash's context in the draft KV pool instead of EAGLE's draft layer -------
    def init_lm_head(self):
        if self.echo_drafter != "dflash":
            return super().init_lm_head()
        from .dflash import DFlashPoolContext, load_head

        target = self.target_worker.model_runner
        self.hot_token_id = None  # DFlash drafts over the target's vocabulary with its LM head
        head = load_head(
            self.server_args.speculative_draft_model_path,
            target.model,
            target.model_config.num_hidden_layers,
            self.device,
        )
        self.echo_dflash = DFlashPoolContext(head, self.draft_runner)
        log.info(
            "ECHO DFlash drafter: block_size %d, %d layers, target layers %s",
            head.cfg.block_size,
            head.cfg.num_hidden_layers,
            list(head.cfg.target_layer_ids),
        )

    def _capture_cuda_graphs(self):
        if self.echo_dflash is None:
            return super()._capture_cuda_graphs()
        self.cuda_graph_runner = self.cuda_graph_runner_for_draft_extend = None  # eager block forward

    def _placeholder_draft_input(self, bonus_tokens):
        """The between-steps state EAGLE's plumbing relays, zeroed (children of probability 0, never
        proposed): DFlash reads only the bonus tokens, and a lazy-extend request's children are
        computed by its catch-up."""
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

    def _relay_placeholders(self, nxt) -> None:
        """Zero the state the draft extend would have set on the next step's draft input."""
        fresh = self._placeholder_draft_input(nxt.bonus_tokens)
        nxt.topk_p, nxt.topk_index, nxt.hidden_states = fresh.topk_p, fresh.topk_index, fresh.hidden_states

    def _window_slots(self, batch, kv_loc_plan):
        """The draft pool's slots of the tokens the target just wrote (its plan's, or the batch's)."""
        if kv_loc_plan is not None:
            return kv_loc_plan.write_ids(self.draft_runner.kv_index_translator)
        return batch.out_cache_loc

    def _draft_extend_for_prefill(
        self, batch, target_hidden_states, next_token_ids, mm_input_embeds=None, kv_loc_plan=None
    ):
        if self.echo_dflash is None:
            if self.echo_backlog is not None and not batch.forward_mode.is_idle():
                self.echo_backlog.clear(pool_slots(batch))  # a new request in the slot
            return super()._draft_extend_for_prefill(
                batch, target_hidden_states, next_token_ids, mm_input_embeds, kv_loc_plan=kv_loc_plan
            )
        from .dflash import extend_positions

        if not batch.forward_mode.is_idle():  # every extend token joins its request's context
            self.echo_dflash.write(
                target_hidden_states,
                extend_positions(batch.prefix_lens, batch.extend_lens, self.device),
                self._window_slots(batch, kv_loc_plan),
            )
        return self._placeholder_draft_input(next_token_ids)

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
            if self.echo_dflash is None:
                return super()._draft_extend_for_decode(batch, batch_result, kv_loc_plan=kv_loc_plan)
            return self._dflash_extend_for_decode(batch, batch_result, kv_loc_plan)

    def _record_lazy(self, **tokens: int) -> None:
        if self.echo_metrics is not None:
            self.echo_metrics.on_lazy_extend(**tokens)

    def _dflash_extend_for_decode(self, batch, batch_result, kv_loc_plan):
        nxt = batch_result.next_draft_input
        if not batch.forward_mode.is_idle():
            # The root and accepted drafts (accept_lens of them), moved with their features to the
            # front of each request's verify window, at positions seq_lens .. (pre-verify lengths).
            bs, W = batch.seq_lens.shape[0], self.speculative_num_draft_tokens
            take = torch.arange(W, device=self.device)[None, :] < batch_result.accept_lens[:, None]
            pos = batch.seq_lens.to(torch.int64)[:, None] + torch.arange(W, device=self.device)[None, :]
            feats = batch_result.logits_output.hidden_states.view(bs, W, -1)
            slots = self._window_slots(batch, kv_loc_plan).view(bs, W)
            self.echo_dflash.write(feats[take], pos[take], slots[take])
        self._relay_placeholders(nxt)  # verify set the next bonus tokens; the rest is shape-only for DFlash
        batch_result.logits_output.hidden_states = None


class EchoWorker(AcceptanceObservers, EAGLEWorkerV2):
    """``EAGLEWorkerV2`` running ECHO (or any core policy), ragged or padded-dense verify."""

    echo_budget = None  # budget cost: set by init_cuda_graphs (ragged or padded decides the cost)

    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        if configured_drafter() == "dart":  # before the draft model is loaded
            from .dart import register_dart_model

            register_dart_model()
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        cfg = load_config(
            num_steps=self.speculative_num_steps,
            topk=self.topk,
            num_draft_tokens=self.speculative_num_draft_tokens,
        )
        check_consistent(cfg, self.speculative_num_steps, self.topk, self.speculative_num_draft_tokens)
        calib = load_calibration_for(
            cfg, model_path=server_args.model_path, draft_path=server_args.speculative_draft_model_path
        )
        self.echo_cfg = cfg = resolve_control_kernel(cfg, self.device)
        self.echo_kmax = server_kmax(cfg, calib, self.device)
        self.echo_policy = make_echo_policy(cfg, calib, self.echo_kmax)
        self.echo_width = cfg.resolved_width()
        self.echo_verify = "padded"  # until init_cuda_graphs: the target's backend and graphs decide
        self.echo_probe = ProbeRecorder.from_env(self.device)
        dw = self._draft_worker
        if dw is not None:
            dw.__class__ = EchoDraftWorker
            dw.echo_cfg, dw.echo_policy, dw.echo_width = cfg, self.echo_policy, self.echo_width
            dw.echo_kmax = self.echo_kmax
            dw.echo_probe = self.echo_probe
            dw.echo_step = EchoStepState()
            dw.echo_drafter = cfg.drafter
            # The captured draft graph returns EAGLE's organized tree; ECHO drafts eagerly.
            dw.cuda_graph_runner = None
            if cfg.drafter == "dart":
                from .history import TokenHistory

                dw.echo_dart = self._dart_search(dw, server_args, cfg)
                dw.echo_history = TokenHistory(self.device)
        self.echo_lazy_extend = dw is not None and self._lazy_extend_applies(server_args, cfg)
        self.echo_metrics = EchoMetrics(
            self.echo_kmax.flat, enabled=bool(getattr(server_args, "enable_metrics", False))
        )
        self.echo_sync = timing_sync(self.device)
        if dw is not None:
            dw.echo_metrics, dw.echo_sync = self.echo_metrics, self.echo_sync
            dw.echo_guard = DraftGuard(
                self.target_worker.model_runner.model_config.vocab_size, self.echo_metrics.draft_fault
            )
        start_simulation(cfg.drafter, self.target_worker.model_runner.model_config.vocab_size, self.device)
        log.info("ECHO worker: policy %s (%s)", self.echo_policy.name, cfg.describe())

    @staticmethod
    def _lazy_extend_applies(server_args, cfg: EchoConfig) -> bool:
        """The lazy extend needs a drafter that drafts from EAGLE's draft extend, and no overlap
        scheduling (whose relayed draft state and lengths it was not built for)."""
        if cfg.lazy_extend == 0 or cfg.drafter not in ("eagle3", "dart"):
            return False
        if not server_args.disable_overlap_schedule:
            log.info("ECHO worker: lazy extend off under overlap scheduling (every step extends the draft KV)")
            return False
        return True

    def alloc_memory_pool(self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None):
        super().alloc_memory_pool(
            memory_pool_config=memory_pool_config,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=token_to_kv_pool_allocator,
        )
        if self.echo_lazy_extend:  # one backlog row per request slot
            self._draft_worker.echo_backlog = DraftBacklog(
                req_to_token_pool.req_to_token.shape[0], self.device, capacity=self.echo_cfg.lazy_extend
            )

    def _dart_search(self, dw, server_args, cfg: EchoConfig):
        from .dart import LlamaForCausalLMDart, make_dart_search

        if not isinstance(dw.draft_runner.model, LlamaForCausalLMDart):
            raise ValueError(
                f"ECHO drafter 'dart': {server_args.speculative_draft_model_path} loaded as "
                f"{type(dw.draft_runner.model).__name__}, not a DART head (LlamaForCausalLMDart)"
            )
        vocab = self.target_worker.model_runner.model_config.vocab_size
        return make_dart_search(server_args.speculative_draft_model_path, vocab, cfg.dart_ngram, self.device)

    def init_cuda_graphs(self):
        super().init_cuda_graphs()
        self._init_verify()
        dw = self._draft_worker
        if dw is not None:  # a graph captured for W replays W-wide steps only
            dw.echo_step_width = (
                self.echo_verify == "ragged"
                and self.target_worker.model_runner.decode_cuda_graph_runner is None
                and dw.cuda_graph_runner_for_draft_extend is None
            )
            log.info(
                "ECHO worker: verify width %s", "per step (max K_i)" if dw.echo_step_width else f"{self.echo_width}"
            )

    def _init_verify(self):
        """Ragged or padded verify (.ragged.resolve_verify_mode), once the target's backend and its
        CUDA graphs exist: the scheduler captures the target's graphs after every backend is built."""
        target = self.target_worker.model_runner
        graphs = target.decode_cuda_graph_runner
        self.echo_verify = resolve_verify_mode(self.echo_cfg.verify, target.attn_backend, graphs)
        ragged = self.echo_verify == "ragged"
        self.echo_budget = make_step_budget(
            self.echo_cfg, self.echo_policy, None if ragged else self.echo_width, self.echo_kmax
        )
        if self.echo_budget is not None:  # the cost model needs true device times
            self.echo_sync = timing_sync(self.device, force=True)
        if self._draft_worker is not None:
            dw = self._draft_worker
            dw.echo_ragged, dw.echo_budget, dw.echo_sync = ragged, self.echo_budget, self.echo_sync
            dw.echo_ragged_graphs = ragged and graphs is not None
            if ragged:  # a ragged forward reads each request's W x W tree block, never a FULL_MASK row
                dw.tree_mask_mode = TreeMaskMode.QLEN_ONLY
        log.info("ECHO worker: %s verify, %s budget", self.echo_verify, self.echo_cfg.budget)

    def forward_batch_generation(self, batch, *args, **kwargs):
        """EAGLEWorkerV2's step; decode steps are timed whole (``echo_step_seconds``)."""
        if (
            batch.forward_mode.is_extend()
            or getattr(batch, "is_extend_in_batch", False)
            or batch.forward_mode.is_idle()
        ):
            return super().forward_batch_generation(batch, *args, **kwargs)
        t0 = time.perf_counter()
        result = super().forward_batch_generation(batch, *args, **kwargs)
        self.echo_sync()
        step_s = time.perf_counter() - t0
        st = getattr(self._draft_worker, "echo_step", None)
        if st is not None and st.timed:  # this step drafted (and verified) real trees
            st.timed = False
            self.echo_metrics.on_timing(control=st.control_s, draft=st.draft_s, verify=st.verify_s, step=step_s)
            if self.echo_budget is not None:
                decision = self.echo_budget.observe_step(
                    batch_size=st.sizes.numel(),
                    target_tokens=st.forward_tokens,
                    verified_tokens=st.verified,
                    draft_forwards=st.draft_forwards,
                    draft_s=st.draft_s + st.control_s,
                    verify_s=st.verify_s,
                    step_s=step_s,
                    cap=st.cap,
                )
                self.echo_metrics.on_budget_step(decision, step_s)
        return result

    def verify(self, batch, pp_proxy_tensors=None, grammar_barrier=None):
        st = getattr(self._draft_worker, "echo_step", None)
        if batch.forward_mode.is_idle() or st is None or st.sizes is None:
            return self._verify(batch, pp_proxy_tensors, grammar_barrier)
        forward_tokens = target_tokens(
            self.echo_verify, st.sizes, st.width, self.target_worker.model_runner.decode_cuda_graph_runner, st.verified
        )
        timing = nullcontext() if self.echo_probe is None else self.echo_probe.timed_verify(forward_tokens)
        t0 = time.perf_counter()
        with timing:
            result = self._verify(batch, pp_proxy_tensors, grammar_barrier)
        self.echo_sync()
        st.verify_s = time.perf_counter() - t0
        st.forward_tokens = forward_tokens
        result.cap_lens = st.sizes
        self.echo_metrics.check_budget(self.echo_policy, st)
        self.echo_metrics.on_step(st, forward_tokens)
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
