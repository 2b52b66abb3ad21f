"""The compatibility hook table: every sglang attribute the ECHO plugin overrides or calls.

Each row names a module, a dotted attribute and the parameter names we rely on (in order, as
``inspect.signature`` reports them; ``None`` = only existence is checked). The plugin checks
the ``"register"`` rows when it registers (cheap: those modules are already imported when
sglang loads plugins) and the ``"worker"`` rows in the scheduler, right before it builds the
worker (importing the EAGLE worker costs seconds, so registration stays lazy). On any
difference it refuses with a message naming the row, rather than failing somewhere deep in a
forward pass. ``tests/integration/test_registration.py`` checks the whole table.

Two sglang constructors build what ECHO must build differently and offer no seam for it
(``EAGLEWorkerV2.__init__`` builds its draft worker inline; ``NGRAMWorker.__init__`` builds the
C++ corpus): the ECHO workers set the same state themselves. :data:`MIRRORS` pins the attributes
each constructor assigns, and the ``"worker"`` check refuses an sglang whose constructor assigns
another set (ours would lack state sglang reads, or set state it no longer reads).

Pinned against sglang 0.5.23 (``TESTED_SGLANG``). A different version whose rows all match is
accepted (with a warning).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import logging
import multiprocessing
import textwrap
from dataclasses import dataclass
from typing import Callable, Optional

log = logging.getLogger(__name__)

TESTED_SGLANG = "0.5.23"


class EchoCompatError(RuntimeError):
    """The installed sglang differs from what the ECHO plugin was written against."""


@dataclass(frozen=True)
class Hook:
    module: str
    attr: str  # dotted, e.g. "EAGLEWorkerV2.verify"
    params: Optional[tuple[str, ...]]  # expected parameter names, in order (prefix), or None
    why: str
    phase: str = "worker"  # "register" or "worker"
    # The module imports sglang's compiled kernels (sgl_kernel) at import time: where they are
    # absent (a CPU box outside the echo CPU engine) the row cannot be checked and is skipped;
    # the scheduler, where the worker runs, always has them (the CPU engine shims them).
    kernels: bool = False
    # The row is sglang's HTTP server, hooked only where it runs (serves_http): the
    # processes sglang spawns skip the row rather than import the server (about 1 s each).
    http: bool = False


_SI = "sglang.srt.speculative.spec_info"
_SR = "sglang.srt.speculative.spec_registry"
_EW = "sglang.srt.speculative.eagle_worker_v2"
_EC = "sglang.srt.speculative.eagle_worker_common"
_NW = "sglang.srt.speculative.ngram_worker"
_RC = "sglang.srt.runtime_context"
_EU = "sglang.srt.speculative.eagle_utils"
_TM = "sglang.srt.managers.tokenizer_manager"
_IO = "sglang.srt.managers.io_struct"
_XG = "sglang.srt.constrained.xgrammar_backend"
_CG = "sglang.srt.model_executor.runner.decode_cuda_graph_runner"


@dataclass(frozen=True)
class Mirror:
    """An sglang constructor an ECHO worker re-implements: the attributes it assigns to ``self``."""

    module: str
    cls: str
    attrs: frozenset[str]
    why: str
    kernels: bool = False  # as Hook.kernels


# EchoWorker.__init__ sets these as EAGLEWorkerV2.__init__ does, its _draft_worker an EchoDraftWorker.
EAGLE_WORKER_INIT_ATTRS = frozenset(
    {
        "server_args",
        "topk",
        "speculative_num_steps",
        "speculative_num_draft_tokens",
        "gpu_id",
        "device",
        "_target_worker",
        "page_size",
        "speculative_algorithm",
        "enable_dp_spec_prefill_coordination",
        "_hosts_draft",
        "_draft_worker",
        "adaptive_controller",
        "num_new_pages_per_topk",
        "extend_lens",
        "plan_stream",
        "plan_stream_ctx",
    }
)
# EchoNgramWorker.__init__ sets these as NGRAMWorker.__init__ does, its ngram_corpus a RequestDrafters.
NGRAM_WORKER_INIT_ATTRS = frozenset(
    {
        "server_args",
        "enable_overlap",
        "_target_worker",
        "model_runner",
        "page_size",
        "draft_token_num",
        "max_trie_depth",
        "speculative_num_draft_tokens",
        "topk",
        "speculative_num_steps",
        "device",
        "adaptive_controller",
        "_prev_decode_rids",
        "grammar_tree_host",
        "ngram_corpus",
    }
)

MIRRORS: tuple[Mirror, ...] = (
    Mirror(
        "sglang.srt.speculative.eagle_worker_v2",
        "EAGLEWorkerV2",
        EAGLE_WORKER_INIT_ATTRS,
        "EchoWorker.__init__ builds EchoDraftWorker where sglang builds its EagleDraftWorker",
    ),
    Mirror(
        "sglang.srt.speculative.ngram_worker",
        "NGRAMWorker",
        NGRAM_WORKER_INIT_ATTRS,
        "EchoNgramWorker.__init__ builds RequestDrafters where sglang builds its C++ corpus",
        kernels=True,
    ),
)


def assigned_attrs(fn: Callable) -> set[str]:
    """The attributes a function assigns to ``self`` (``self.x = ...``, tuple targets, annotated
    and augmented assignments), read from its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))

    def flat(target: ast.expr):
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                yield from flat(t)
        elif isinstance(target, ast.Starred):
            yield from flat(target.value)
        else:
            yield target

    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for t in flat(target):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    out.add(t.attr)
    return out


def init_drift(mirror: Mirror) -> Optional[str]:
    """How the installed sglang's constructor differs from ``mirror`` (None: it assigns exactly
    ``mirror.attrs``). Raises ImportError where its module does not import."""
    cls = getattr(importlib.import_module(mirror.module), mirror.cls)
    got = assigned_attrs(cls.__init__)
    if got == mirror.attrs:
        return None
    new, gone = sorted(got - mirror.attrs), sorted(mirror.attrs - got)
    return f"{mirror.module}:{mirror.cls}.__init__ ({mirror.why}) now also sets {new}, no longer sets {gone}"


HOOKS: tuple[Hook, ...] = (
    # -- registration (plugin.register, spec.EchoSpecAlgo) ---------------------------------
    Hook(
        _SI,
        "SpeculativeAlgorithm.register",
        ("name", "supports_overlap", "validate_server_args", "spec_class"),
        "registers ECHO",
        "register",
    ),
    Hook(
        _SI,
        "SpeculativeAlgorithm.from_string",
        ("name",),
        "resolves --speculative-algorithm ECHO (and EchoWorker's speculative_algorithm)",
        "register",
    ),
    Hook(
        _SR,
        "CustomSpecAlgo.__init__",
        ("self", "name", "factory", "supports_overlap", "validate_server_args"),
        "EchoSpecAlgo base class",
        "register",
    ),
    Hook(
        _SR,
        "CustomSpecAlgo.handle_server_args",
        ("self", "server_args"),
        "EchoSpecAlgo.handle_server_args override",
        "register",
    ),
    Hook(_SR, "CustomSpecAlgo.create_worker", ("self", "server_args"), "calls our factory", "register"),
    Hook(_SR, "get_spec", ("name",), "idempotent registration", "register"),
    # Methods the enum has and CustomSpecAlgo lacks; EchoSpecAlgo mirrors them.
    Hook(
        _SI,
        "SpeculativeAlgorithm.create_future_map",
        ("self", "device", "req_to_token_pool", "needs_cpu_seq_lens", "needs_confidence_relay"),
        "EchoSpecAlgo.create_future_map mirrors it",
        "register",
    ),
    Hook(_SI, "SpeculativeAlgorithm.need_topk", ("self",), "EchoSpecAlgo.need_topk", "register"),
    Hook(_SI, "SpeculativeAlgorithm.carries_draft_hidden_states", ("self",), "EchoSpecAlgo mirrors it", "register"),
    Hook(_SI, "SpeculativeAlgorithm.get_platform_worker_cls", ("self",), "EchoSpecAlgo mirrors it", "register"),
    Hook(
        "sglang.srt.managers.overlap_utils",
        "FutureMap",
        ("device", "spec_algo", "req_to_token_pool", "needs_cpu_seq_lens", "needs_confidence_relay"),
        "EchoSpecAlgo.create_future_map builds it",
        "worker",
    ),
    # -- the worker -------------------------------------------------------------------------
    Hook(
        _EW,
        "EAGLEWorkerV2.__init__",
        ("self", "server_args", "gpu_id", "nccl_port", "target_worker"),
        "EchoWorker base; scheduler constructs it with these arguments; re-implemented (MIRRORS)",
    ),
    Hook(
        _EW,
        "EagleDraftWorker.__init__",
        ("self", "server_args", "gpu_id", "nccl_port", "target_worker"),
        "EchoDraftWorker base, built by EchoWorker.__init__ as EAGLEWorkerV2.__init__ builds it",
    ),
    Hook(_EW, "EAGLEWorkerV2.init_cuda_graphs", ("self",), "overridden by EchoWorker: settles verify and width"),
    Hook(_RC, "get_spec", (), "speculative settings in both workers' __init__"),
    Hook(_RC, "get_schedule", (), "page size (and overlap) in both workers' __init__"),
    Hook(_RC, "get_device", (), "device in both workers' __init__"),
    Hook("sglang.srt.environ", "envs.SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION", None, "EchoWorker.__init__"),
    Hook("sglang.srt.speculative.spec_utils", "get_plan_stream", ("device",), "EchoWorker.__init__"),
    Hook("sglang.srt.speculative.base_spec_worker", "BaseSpecWorker.__init__", ("self",), "both workers' __init__"),
    Hook(
        _EW,
        "EAGLEWorkerV2.verify",
        ("self", "batch", "pp_proxy_tensors", "grammar_barrier"),
        "overridden by EchoWorker",
    ),
    Hook(
        _EW,
        "EAGLEWorkerV2.on_verify_complete_cpu",
        ("self", "num_correct_drafts_per_req", "batch_size"),
        "overridden (metrics)",
    ),
    Hook(_EW, "EAGLEWorkerV2._draft_worker", None, "EchoWorker.__init__ sets it to its EchoDraftWorker"),
    Hook(
        _EW,
        "EAGLEWorkerV2.forward_batch_generation",
        ("self", "batch"),
        "overridden by EchoWorker: times the decode step (echo_step_seconds)",
    ),
    Hook(_EW, "EagleDraftWorker.draft", ("self", "batch", "with_topology"), "overridden by EchoDraftWorker"),
    Hook(
        _EW,
        "EagleDraftWorker.alloc_memory_pool",
        ("self", "memory_pool_config", "req_to_token_pool", "token_to_kv_pool_allocator"),
        "overridden by EchoDraftWorker: the lazy extend's backlog; calls init_lm_head",
    ),
    Hook(_EW, "EagleDraftWorker.tree_mask_mode", None, "EchoDraftWorker's verify mask layout without a buffer"),
    Hook(_EW, "EagleDraftWorker.draft_runner", None, "the draft model runner (every drafter)"),
    Hook(_EW, "EagleDraftWorker.draft_forward", ("self", "forward_batch"), "replaced by the frontier drafter"),
    Hook(
        _EC,
        "prepare_for_draft",
        (
            "draft_input",
            "req_to_token_pool",
            "batch",
            "cuda_graph_runner",
            "draft_model_runner",
            "topk",
            "num_steps",
            "target_translator",
            "num_draft_tokens",
        ),
        "called by EchoDraftWorker.draft",
    ),
    Hook(
        _EC,
        "run_eagle_verify",
        (
            "batch",
            "target_worker",
            "req_to_token_pool",
            "token_to_kv_pool_allocator",
            "plan_stream",
            "plan_stream_ctx",
            "topk",
            "num_draft_tokens",
            "device",
            "metadata_ready_pre_pad",
            "finalize_tree_path",
            "pp_proxy_tensors",
            "grammar_barrier",
        ),
        "called by EchoWorker.verify",
    ),
    Hook(
        "sglang.srt.speculative.eagle_utils",
        "per_step_draft_out_cache_loc",
        ("out_cache_loc", "batch_size", "topk", "num_steps"),
        "draft KV lanes",
    ),
    Hook("sglang.srt.speculative.eagle_utils", "TreeMaskMode.QLEN_ONLY", None, "verify mask layout"),
    Hook("sglang.srt.speculative.eagle_utils", "TreeMaskMode.FULL_MASK", None, "verify mask layout"),
    Hook(
        "sglang.srt.speculative.eagle_info",
        "EagleVerifyInput",
        (
            "draft_token",
            "custom_mask",
            "positions",
            "retrieve_index",
            "retrieve_next_token",
            "retrieve_next_sibling",
            "retrieve_cum_len",
            "spec_steps",
            "topk",
            "draft_token_num",
            "capture_hidden_mode",
            "seq_lens_sum",
            "seq_lens_cpu",
        ),
        "EchoVerifyInput base",
    ),
    Hook(
        "sglang.srt.speculative.eagle_info",
        "EagleVerifyInput.create_idle_input",
        ("topk", "spec_steps", "num_verify_tokens", "device"),
        "idle batches",
    ),
    Hook("sglang.srt.speculative.eagle_info", "EagleVerifyInput.tree_topk", None, "overridden (-1: irregular tree)"),
    Hook("sglang.srt.speculative.spec_utils", "fast_topk", ("values", "topk", "dim"), "draft children"),
    Hook(
        "sglang.srt.speculative.spec_utils",
        "renorm_draft_probs",
        ("next_token_logits", "sampling_info", "use_rejection_sampling"),
        "draft distribution",
    ),
    Hook("sglang.srt.model_executor.forward_context", "forward_context", ("ctx", "forward_batch"), "draft forward"),
    Hook("sglang.srt.model_executor.forward_context", "ForwardContext", ("attn_backend",), "draft forward"),
    Hook("sglang.srt.managers.utils", "GenerationBatchResult", None, "verify result; we set cap_lens"),
    # -- the DART drafter (integration/dart.py, drafter: dart) ----------------------------------
    Hook(
        "sglang.srt.models.llama_eagle3",
        "LlamaForCausalLMEagle3.__init__",
        ("self", "config", "quant_config", "prefix"),
        "LlamaForCausalLMDart base",
        kernels=True,
    ),
    Hook(
        "sglang.srt.models.llama_eagle3",
        "LlamaForCausalLMEagle3.load_weights",
        ("self", "weights"),
        "extended: midlayer.mask_rep, the rest delegated",
        kernels=True,
    ),
    Hook(
        "sglang.srt.models.llama",
        "LlamaAttention.forward_prepare_native",
        ("self", "positions", "hidden_states"),
        "mask_logits repeats it: qkv_proj, split by q_size / kv_size, rotary_emb(positions, q, k)",
        kernels=True,
    ),
    Hook(
        "sglang.srt.models.registry",
        "ModelRegistry",
        None,
        "LlamaForCausalLMDart registered by architecture",
        kernels=True,
    ),
    Hook(
        "sglang.srt.mem_cache.memory_pool",
        "MHATokenToKVPool.get_key_buffer",
        ("self", "layer_id"),
        "mask_logits reads the draft KV prefix",
    ),
    Hook(
        "sglang.srt.mem_cache.memory_pool",
        "MHATokenToKVPool.get_value_buffer",
        ("self", "layer_id"),
        "mask_logits reads the draft KV prefix",
    ),
    # -- the DFlash drafter (integration/dflash.py, drafter: dflash) ----------------------------
    Hook(
        "sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state",
        "_resolve_eagle_aux_hidden_state",
        ("config", "server_args", "model_config", "spec_algorithm", "is_draft_worker"),
        "wrapped: a DFlash head's target_layer_ids become eagle_aux_hidden_state_layer_ids",
        "register",
    ),
    Hook(
        _EW,
        "EagleDraftWorker.init_lm_head",
        ("self",),
        "overridden: the step drafter's (dflash loads the DFlash head); sglang's is eagle_init_lm_head",
    ),
    Hook(
        _EW,
        "EagleDraftWorker._capture_cuda_graphs",
        ("self",),
        "overridden: sglang's where the step drafter uses draft graphs (not dflash)",
    ),
    Hook(
        _EW,
        "EagleDraftWorker._draft_extend_for_prefill",
        ("self", "batch", "target_hidden_states", "next_token_ids", "mm_input_embeds", "kv_loc_plan"),
        "overridden: the step drafter's (dflash writes the extend tokens' context); sglang's is eagle_extend_*",
    ),
    Hook(
        _EW,
        "EagleDraftWorker._draft_extend_for_decode",
        ("self", "batch", "batch_result", "kv_loc_plan"),
        "overridden: the step drafter's (dflash writes the accepted tokens' context), or deferred (lazy extend)",
    ),
    Hook(_EU, "get_draft_recurrent_hidden_state_spec", ("model_runner",), "dflash: the relayed hidden-state shape"),
    Hook(
        "sglang.srt.mem_cache.memory_pool",
        "MHATokenToKVPool.set_kv_buffer",
        ("self", "layer", "loc_info", "cache_k", "cache_v"),
        "dflash writes its context K/V",
    ),
    Hook("sglang.srt.mem_cache.memory_pool", "KVWriteLoc", None, "dflash: KVWriteLoc(slots, physical=True)"),
    Hook(
        "sglang.srt.mem_cache.kv_loc_plan", "KVLocPlan.write_ids", ("self", "reader"), "dflash: the draft pool's slots"
    ),
    Hook(
        "sglang.srt.models.dflash", "DFlashDraftModel", None, "loads the checkpoint, sizes the draft pool", kernels=True
    ),
    # -- the n-gram drafter worker (ngram_worker.EchoNgramWorker, drafter: ngram) -------------
    Hook(_SI, "SpeculativeAlgorithm.is_ngram", ("self",), "EchoSpecAlgo.is_ngram (drafter ngram)", "register"),
    Hook(_SI, "SpeculativeAlgorithm.has_draft_kv", ("self",), "EchoSpecAlgo.has_draft_kv (drafter ngram)", "register"),
    Hook(
        _NW,
        "NGRAMWorker.__init__",
        ("self", "server_args", "gpu_id", "nccl_port", "target_worker"),
        "EchoNgramWorker base; re-implemented minus the corpus (MIRRORS)",
        kernels=True,
    ),
    Hook(
        _NW,
        "NGRAMWorker._prepare_draft_tokens",
        ("self", "batch"),
        "overridden: returns (tokens [bs*W], QLEN mask [bs*W*W]) from ECHO trees",
        kernels=True,
    ),
    Hook(
        _NW,
        "NGRAMWorker._prepare_for_speculative_decoding",
        ("self", "batch"),
        "calls _prepare_draft_tokens, builds the NgramVerifyInput",
        kernels=True,
    ),
    Hook(_NW, "NGRAMWorker._update_ngram_corpus", ("self", "batch"), "overridden (no-op)", kernels=True),
    Hook(
        _NW,
        "NGRAMWorker.forward_batch_generation",
        ("self", "batch", "on_publish", "pp_proxy_tensors"),
        "wrapped: sets cap_lens, metrics",
        kernels=True,
    ),
    Hook(
        _NW,
        "NGRAMWorker.on_verify_complete_cpu",
        ("self", "num_correct_drafts_per_req", "batch_size"),
        "overridden (metrics)",
        kernels=True,
    ),
    Hook(_NW, "NGRAMWorker.clear_cache_pool", ("self",), "calls ngram_corpus.reset()", kernels=True),
    Hook(_NW, "NGRAMWorker.alloc_memory_pool", None, "inherited", kernels=True),
    Hook(
        _NW,
        "NGRAMWorker.add_external_corpus",
        ("self", "corpus_id", "token_chunks"),
        "overridden (refused)",
        kernels=True,
    ),
    Hook(
        _NW,
        "NGRAMWorker.commit_corpus_load",
        ("self", "corpus_id", "loaded_token_count"),
        "overridden (refused)",
        kernels=True,
    ),
    Hook(_NW, "NGRAMWorker.remove_external_corpus", ("self", "corpus_id"), "overridden (refused)", kernels=True),
    Hook(_NW, "NGRAMWorker.list_external_corpora", ("self",), "overridden (empty)", kernels=True),
    Hook(
        "sglang.srt.speculative.cpp_ngram.ngram_corpus",
        "NgramCorpus.erase_match_state",
        ("self", "req_ids"),
        "stood in for by RequestDrafters (drops departed requests' drafters)",
    ),
    Hook("sglang.srt.speculative.cpp_ngram.ngram_corpus", "NgramCorpus.reset", ("self",), "stood in for"),
    Hook("sglang.srt.speculative.cpp_ngram.ngram_corpus", "NgramCorpus.synchronize", ("self",), "stood in for"),
    Hook("sglang.srt.speculative.ngram_info", "NgramVerifyInput.tree_topk", None, "-1: CPU backends use the mask"),
    Hook("sglang.srt.speculative.ngram_info", "NgramVerifyInput.max_tree_depth", None, "W: accept_index width"),
    Hook(
        "sglang.srt.managers.schedule_batch",
        "ScheduleBatch.grammar_needs_sync",
        ("self",),
        "overlap splice condition, as NGRAM",
    ),
    Hook(
        "sglang.srt.managers.schedule_batch",
        "Req.__init__",
        ("self", "rid", "origin_input_text", "origin_input_ids"),
        "req.rid / origin_input_ids_unpadded / output_ids: the drafter's history",
    ),
    Hook(
        "sglang.srt.managers.schedule_batch",
        "Req.customized_info",
        None,
        "per-token meta_info channel: echo_tree_depth (metrics.record_tree_depths)",
    ),
    Hook("sglang.srt.managers.schedule_batch", "ScheduleBatch.reqs", None, "the step's requests, in batch order"),
    # -- ragged verify (integration/ragged.py; registered by plugin.register) --------------------
    Hook(
        "sglang.srt.model_executor.model_runner",
        "ModelRunner.forward",
        ("self", "forward_batch"),
        "AROUND hook: a marked TARGET_VERIFY batch runs on its real tree nodes only",
    ),
    Hook(
        "sglang.srt.model_executor.forward_batch_info",
        "ForwardBatch",
        None,
        "input_ids / positions / out_cache_loc per token, batch_size, spec_info",
    ),
    Hook(
        _SR,
        "CustomSpecAlgo.supports_ragged_verify",
        ("self",),
        "EchoSpecAlgo overrides it: compact token-tier verify graphs for echo_tree_triton",
        "register",
    ),
    Hook(_CG, "ragged_verify_compact_graphs_enabled", ("spec_algorithm",), "echo_tree_triton: ragged graphs on"),
    Hook(_CG, "DecodeCudaGraphRunner.ragged_verify_mode", None, "the target captured token tiers (graph_tier)"),
    Hook(_CG, "DecodeCudaGraphRunner.capture_num_tokens", None, "the token tiers a ragged verify pads up to"),
    Hook(_CG, "DecodeCudaGraphRunner.max_bs", None, "request slots of a tier"),
    Hook(
        _CG,
        "DecodeCudaGraphRunner._ragged_capture_slots",
        ("self", "num_tokens"),
        "a tier's request slots: graph_tier admits what load_batch accepts",
    ),
    Hook("sglang.srt.speculative.ragged_verify", "round_up_grid", ("total", "grid"), "a ragged verify's tier"),
    Hook(
        "sglang.srt.speculative.ragged_verify",
        "RaggedVerifyLayout.from_verify_lens_device",
        ("verify_lens", "graph_num_tokens"),
        "the layout a compact verify batch carries into the graph runner",
    ),
    Hook(
        "sglang.srt.arg_groups.model_override_base",
        "attention_backends_of",
        ("cfg",),
        "EchoSpecAlgo.supports_ragged_verify: the decode attention backend",
    ),
    Hook(_RC, "get_server_args", (), "EchoSpecAlgo.supports_ragged_verify: the server's arguments"),
    # -- simulated acceptance (integration/simulate.py; registered by plugin.register under SGLANG_ECHO_SIMULATE) --
    Hook(
        _EU,
        "eagle_sample",
        ("verify_input", "batch", "logits_output"),
        "AROUND hook (simulate): the trace's next token wins each verified node's row of next_token_logits [B*W, V]",
    ),
    Hook(
        "sglang.srt.managers.tp_worker",
        "TpModelWorker.forward_batch_generation",
        ("self", "batch", "forward_batch", "pp_proxy_tensors", "is_verify"),
        "AROUND hook (simulate): a target extend's next_token_ids, the trace's (verify passes batch=None)",
    ),
    Hook("sglang.srt.managers.tp_worker", "TpModelWorker.is_draft_worker", None, "simulate: the target's extends only"),
    Hook("sglang.srt.managers.utils", "GenerationBatchResult.next_token_ids", None, "simulate: the prefill's tokens"),
    Hook(
        "sglang.srt.managers.schedule_batch",
        "ScheduleBatch.seq_lens",
        None,
        "simulate: [B] tokens before the step's (the root's position; after an extend, its length)",
    ),
    Hook("sglang.srt.managers.schedule_batch", "Req.origin_input_ids", None, "simulate: a request's trace stream"),
    Hook(
        "sglang.srt.managers.schedule_batch",
        "ScheduleBatch.chunked_req_next_prompt_token",
        None,
        "lazy extend: set while a request is between chunks of its prefill (that prefill extends eagerly)",
    ),
    Hook(
        "sglang.srt.sampling.sampling_params",
        "SamplingParams.max_new_tokens",
        None,
        "lazy extend: a prefill defers its extend only if prompt and reply fit the backlog",
    ),
    # -- the request guard (integration/request_guard.py; registered by plugin.register, every server) --
    Hook(
        _TM,
        "TokenizerManager._validate_one_request",
        ("self", "obj", "input_ids"),
        "BEFORE hook: each split, tokenized request checked against the model (ids, sampling, logprobs)",
        "register",
    ),
    Hook(
        _TM, "TokenizerManager.init_model_config", ("self",), "sets the guard's model_config, context_len", "register"
    ),
    Hook(
        "sglang.srt.configs.model_config",
        "ModelConfig._derive_model_shapes",
        ("self",),
        "sets the vocab_size / hidden_size the guard reads",
        "register",
    ),
    Hook(
        _IO,
        "GenerateReqInput.normalize_batch_and_arguments",
        ("self",),
        "BEFORE hook: the guard bounds n before sglang expands the request by it",
        "register",
    ),
    Hook(_IO, "GenerateReqInput.contains_mm_input", ("self",), "the guard skips processor placeholder ids", "register"),
    Hook(_IO, "GenerateReqInput.top_logprobs_num", None, "checked by the guard", "register"),
    Hook(_IO, "GenerateReqInput.logprob_start_len", None, "checked by the guard", "register"),
    Hook(_IO, "GenerateReqInput.positional_embed_overrides", None, "checked by the guard", "register"),
    Hook("sglang.srt.managers.embed_types", "PositionalEmbeds.positions", None, "checked by the guard", "register"),
    Hook(_IO, "SessionParams.__struct_fields__", None, "the guard checks session_params fields and types", "register"),
    Hook(
        _XG,
        "XGrammarGrammarBackend._from_context",
        ("self", "ctx", "key_string", "grammar_stats"),
        "AROUND hook: a grammar that admits no output becomes an InvalidGrammarObject (a 400)",
        "register",
    ),
    Hook(_XG, "XGrammarGrammarBackend.vocab_size", None, "the guard's first-token mask width", "register"),
    Hook(
        _XG,
        "XGrammarGrammar.allocate_vocab_mask",
        ("self", "vocab_size", "batch_size", "device"),
        "the guard's first-token mask",
        "register",
    ),
    Hook(
        _XG,
        "XGrammarGrammar.fill_vocab_mask",
        ("self", "vocab_mask", "idx"),
        "the guard's first-token mask",
        "register",
    ),
    Hook(
        _XG, "XGrammarGrammar.is_terminated", ("self",), "an empty mask is fine where the grammar may end", "register"
    ),
    Hook(
        "sglang.srt.constrained.base_grammar_backend",
        "InvalidGrammarObject",
        ("error_message",),
        "what the guard returns for a grammar that admits no output (sglang answers it with a 400)",
        "register",
    ),
    Hook(
        "sglang.srt.entrypoints.http_server",
        "ORJSONRequest.json",
        ("self",),
        "AROUND hook: a /v1/ body that is not a JSON object is a JSON error (a 400), not a 500",
        "register",
        http=True,
    ),
    # -- the CPU platform's start-up (sglang_echo.platform.fork_children) ------------------------
    Hook(
        "sglang.srt.entrypoints.engine",
        "_set_envs_and_config",
        ("server_args",),
        "AROUND hook on CPU: sets the fork start method after sglang sets spawn",
    ),
    # -- the CPU platform's sampled verify (sglang_echo.platform.plugin; all workers verify with it) --
    Hook(
        _EU,
        "eagle_sample",
        ("verify_input", "batch", "logits_output", "grammar_mask"),
        "verify of EAGLE/NGRAM/both ECHO workers; reads the names below as module globals at call time",
    ),
    Hook(
        _EU,
        "_verify_uses_greedy",
        ("is_all_greedy", "is_cpu", "is_hip", "is_xpu", "use_rejection_sampling"),
        "AROUND hook on CPU: drops the is_cpu term so sampled batches are verified by sampling",
    ),
    Hook(_EU, "tree_speculative_sampling_target_only", None, "None on CPU; bound to ops.spec_sampling"),
    Hook(_EU, "top_k_renorm_prob", None, "None on CPU; bound to ops.spec_sampling"),
    Hook(_EU, "top_p_renorm_prob", None, "None on CPU; bound to ops.spec_sampling"),
    Hook(
        "sglang.kernels.ops.speculative.sampling",
        "tree_speculative_sampling_target_only",
        (
            "predicts",
            "accept_index",
            "accept_token_num",
            "candidates",
            "retrive_index",
            "retrive_next_token",
            "retrive_next_sibling",
            "uniform_samples",
            "uniform_samples_for_final_sampling",
            "target_probs",
            "draft_probs",
            "threshold_single",
            "threshold_acc",
            "deterministic",
        ),
        "the CUDA op whose signature and semantics ops.spec_sampling mirrors",
    ),
)


def _resolve(hook: Hook):
    obj = importlib.import_module(hook.module)
    for part in hook.attr.split("."):
        if not hasattr(obj, part) and inspect.isclass(obj):
            _check_instance_attr(obj, part)
            return None
        obj = getattr(obj, part)
    return obj


def _check_instance_attr(cls: type, name: str) -> None:
    """An attribute set per instance: a dataclass field, or assigned in the constructor."""
    if name in getattr(cls, "__dataclass_fields__", {}):
        return
    try:
        if f"self.{name}" in inspect.getsource(cls.__init__):
            return
    except (OSError, TypeError):  # a generated constructor has no source
        pass
    raise AttributeError(f"{cls.__name__} instances no longer carry {name!r}")


def serves_http() -> bool:
    """True in the process sglang was launched in (its HTTP server's), False in those it spawns."""
    return multiprocessing.parent_process() is None


def check_hooks(phase: Optional[str] = None) -> list[str]:
    """Problems found (empty = compatible). ``phase`` selects "register" or "worker" rows."""
    problems = []
    for h in HOOKS:
        if phase is not None and h.phase != phase:
            continue
        if h.http and not serves_http():
            continue
        where = f"{h.module}:{h.attr} ({h.why})"
        try:
            obj = _resolve(h)
        except ModuleNotFoundError as e:
            if h.kernels and (e.name or "").split(".")[0] == "sgl_kernel":
                continue  # no compiled kernels in this process (see Hook.kernels)
            problems.append(f"{where}: missing ({type(e).__name__}: {e})")
            continue
        except (ImportError, AttributeError) as e:
            problems.append(f"{where}: missing ({type(e).__name__}: {e})")
            continue
        if h.params is None or obj is None:
            continue
        if h.attr == "GenerationBatchResult":
            continue
        try:
            got = tuple(inspect.signature(obj).parameters)
        except (TypeError, ValueError) as e:
            problems.append(f"{where}: no inspectable signature ({e})")
            continue
        if got[: len(h.params)] != h.params:
            problems.append(f"{where}: expected parameters {h.params}, installed sglang has {got}")
    if phase in (None, "worker"):
        for m in MIRRORS:
            try:
                drift = init_drift(m)
            except ModuleNotFoundError as e:
                if m.kernels and (e.name or "").split(".")[0] == "sgl_kernel":
                    continue  # as a Hook's kernels rows
                drift = f"{m.module}:{m.cls}: missing ({type(e).__name__}: {e})"
            except (ImportError, AttributeError, OSError, TypeError) as e:
                drift = f"{m.module}:{m.cls}.__init__: unreadable ({type(e).__name__}: {e})"
            if drift is not None:
                problems.append(drift)
        try:
            from sglang.srt.managers.utils import GenerationBatchResult

            if "cap_lens" not in inspect.signature(GenerationBatchResult).parameters:
                problems.append("sglang.srt.managers.utils:GenerationBatchResult has no cap_lens field")
        except Exception as e:  # pragma: no cover - import failure is reported above
            problems.append(f"sglang.srt.managers.utils:GenerationBatchResult: {e}")
    return problems


def sglang_version() -> str:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:
        import sglang

        return getattr(sglang, "__version__", "unknown")


def assert_compatible(phase: Optional[str] = None) -> None:
    problems = check_hooks(phase)
    ver = sglang_version()
    if problems:
        raise EchoCompatError(
            f"ECHO plugin: the installed sglang {ver} differs from the tested {TESTED_SGLANG} in "
            f"{len(problems)} hook(s) the plugin depends on; refusing to register/run:\n  - " + "\n  - ".join(problems)
        )
    if ver != TESTED_SGLANG:
        log.warning("ECHO plugin: sglang %s is untested (tested: %s); all hooks match", ver, TESTED_SGLANG)
