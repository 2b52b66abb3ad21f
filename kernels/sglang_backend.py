"""``echo_tree_triton``: sglang attention backend whose TARGET_VERIFY runs our Triton tree kernel.

A thin adapter over sglang 0.5.23's in-tree :class:`TritonAttnBackend`: prefill, decode and draft
modes are inherited unchanged; TARGET_VERIFY runs the tree kernel on one of two layouts.

* **Padded** (sglang's uniform TARGET_VERIFY, ECHO ``verify: padded``): every request has
  ``num_tokens_per_req`` queries. The inherited metadata already matches the kernel's contract
  (``kv_indptr / kv_indices`` = each request's cached prefix, the tree tokens' K/V written at
  ``out_cache_loc`` first); sglang's byte ``custom_mask`` (FULL_MASK: ``n`` rows of ``prefix + n``
  per request; QLEN_ONLY: ``n x n``, told apart by its size) becomes our bit-packed rows once per
  forward, reused by every layer.
* **Ragged** (ECHO ``verify: ragged``, :mod:`sglang_echo.integration.ragged`): the forward holds
  the ``N = sum K_i`` real tree nodes, request-major, padded up to ``T`` lanes (a CUDA-graph token
  tier; ``T = N`` eagerly). The verify input carries ``K`` (``echo_verify_lens``) and the dense
  QLEN_ONLY tree mask; the metadata comes from :mod:`.tree_attention.ragged_tier`: ``K_b``
  queries per request, padding lanes in padding requests that output exactly 0. Under sglang's
  compact ragged-verify graphs (``SGLANG_RAGGED_VERIFY_MODE=compact`` and ECHO's
  ``supports_ragged_verify()``) the target's decode graph runner captures one graph per token
  tier; this backend then builds that metadata into static buffers
  (:class:`.tree_attention.graph_buffers.TreeVerifyGraphBuffers`) before every replay, with
  device ops only, and at capture from the tier alone (no real request). sglang's own
  ``supports_ragged_verify_graph`` means "ragged chains"; ECHO also requires
  ``supports_ragged_verify`` (trees), which only this backend and ``echo_torch`` declare.

Registered by the ECHO plugin through :mod:`..registration` (this module is imported only when a
server selects ``--attention-backend echo_tree_triton``). GPU-only at runtime; the ragged paths are
tested on the CPU with the kernel under ``TRITON_INTERPRET=1`` (``tests/kernels/test_ragged_tier.py``).

Not done (see kernels/README.md): sliding-window layers, attention sinks, logit soft-cap,
``score_mod`` and fp8 KV fall back to the inherited Triton path in padded verify and are refused in
ragged verify; the prefix is not split (split-K) inside ragged graphs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
from sglang.srt.layers.attention.triton_backend import ForwardMetadata, TritonAttnBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from sglang_echo.core.dense import RAGGED_MARK

from .registration import BACKEND_NAME  # noqa: F401  (re-exported)
from .tree_attention.metadata import TreeAttentionPlan
from .tree_attention.ragged_tier import (
    DEFAULT_PAD_CHUNK,
    RaggedTreeMetadata,
    packed_tree_rows,
    padding_requests,
    tier_metadata,
)

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


def create_backend(runner: Any) -> "EchoTreeVerifyBackend":
    """Factory behind the ``echo_tree_triton`` registry entry (see :mod:`..registration`)."""
    return EchoTreeVerifyBackend(runner)


def ragged_request(forward_batch: "ForwardBatch") -> Optional[tuple[torch.Tensor, torch.Tensor, int]]:
    """``(K [B], packed dense tree rows [B*W, words], W)`` of a compact (ragged) verify forward,
    None for any other forward (a graph capture's verify input carries no ``K``)."""
    spec_info = forward_batch.spec_info
    layout = getattr(spec_info, "ragged_verify_layout", None)
    lens = layout.verify_lens if layout is not None else getattr(spec_info, RAGGED_MARK, None)
    if lens is None:
        return None
    width = spec_info.draft_token_num
    return lens, packed_tree_rows(spec_info.custom_mask, forward_batch.seq_lens[: lens.numel()], width), width


def unsupported_layer(
    layer: "RadixAttention",
    q: torch.Tensor,
    k_cache: torch.Tensor,
    k: Any,
    v: Any,
    sinks: Any,
    score_mod: Any,
    aux_tensors: Any,
) -> Optional[str]:
    """What in this layer the tree kernel does not compute (None: nothing)."""
    for what, cond in (
        ("attention sinks", sinks is not None),
        ("score_mod", score_mod is not None),
        ("aux tensors", aux_tensors is not None),
        ("sliding-window attention", (layer.sliding_window_size or -1) > -1),
        ("logit soft-cap", (layer.logit_cap or 0) > 0),
        ("different QK and V head dims", layer.qk_head_dim != layer.v_head_dim),
        ("no new K/V", k is None or v is None),
        (f"a {k_cache.dtype} KV cache", k_cache.dtype != q.dtype),
    ):
        if cond:
            return what
    return None


class EchoTreeVerifyBackend(TritonAttnBackend):
    """sglang's Triton backend with the TARGET_VERIFY attention swapped for the tree kernel."""

    supports_ragged_verify = True  # ECHO: marked verify batches of ragged trees (integration/ragged.py)
    supports_ragged_verify_graph = True  # sglang: compact token-tier verify graphs

    def __init__(self, model_runner: Any, *args: Any, **kwargs: Any):
        super().__init__(model_runner, *args, **kwargs)
        from sglang.srt.model_executor.runner.decode_cuda_graph_runner import ragged_verify_compact_graphs_enabled

        from .tree_attention.triton_kernel import default_blocks

        self._tree_key: Optional[object] = None  # the forward_metadata the padded cache belongs to
        self._tree: Optional[tuple[torch.Tensor, torch.Tensor, TreeAttentionPlan]] = None
        self._ragged: Optional[RaggedTreeMetadata] = None  # this forward's ragged metadata ...
        self._ragged_key: Optional[object] = None  # ... and the forward_metadata it belongs to
        self._head_dim = model_runner.model_config.head_dim
        self._block_m = default_blocks(
            max(1, self.num_head // self.num_kv_head), self._head_dim, torch.device(self.device)
        )[0]
        self._graph_bufs = None  # TreeVerifyGraphBuffers, with ragged graphs (init_cuda_graph_state)
        # The target's decode graph runner captures compact token tiers under the same condition.
        self._ragged_graphs = not model_runner.is_draft_worker and ragged_verify_compact_graphs_enabled(
            model_runner.spec_algorithm
        )
        if self._ragged_graphs:
            self._refuse_ragged_graphs()

    def _refuse_ragged_graphs(self) -> None:
        why = (
            "sliding-window attention"
            if (self.sliding_window_size or 0) > 0
            else "decode context parallelism"
            if self.dcp_size > 1
            else None
        )
        if why:
            raise ValueError(
                f"{BACKEND_NAME}: ECHO's ragged verify under CUDA graphs does not support {why}; "
                f"set ECHO verify=padded (SGLANG_ECHO_VERIFY=padded)"
            )

    # -- ragged verify: metadata ------------------------------------------------------------------
    def init_forward_metadata(self, forward_batch: "ForwardBatch"):
        request = ragged_request(forward_batch) if forward_batch.forward_mode.is_target_verify() else None
        if request is None:
            self._ragged = None
            return super().init_forward_metadata(forward_batch)
        lens, rows, width = request
        bs, tier = forward_batch.batch_size, forward_batch.input_ids.shape[0]
        r = bs + padding_requests(tier, DEFAULT_PAD_CHUNK)
        kv_indptr = torch.zeros(r + 1, dtype=torch.int32, device=self.device)
        kv_indices = torch.empty(
            forward_batch.seq_lens_sum or bs * self.max_context_len, dtype=torch.int64, device=self.device
        )
        self._fill_kv_indptr_and_indices(
            forward_batch.kv_loc_plan,
            bs,
            forward_batch.seq_lens,
            forward_batch.req_pool_indices,
            kv_indices,
            kv_indptr=kv_indptr[: bs + 1],
        )
        md = tier_metadata(
            lens,
            width,
            tier,
            bs,
            rows,
            kv_indptr,
            kv_indices,
            block_m=self._block_m,
            num_splits=self._eager_splits(tier, r),
        )
        self._set_ragged(md, width, bs)

    def _eager_splits(self, tier: int, requests: int) -> int:
        from .tree_attention.metadata import block_capacity
        from .tree_attention.triton_kernel import choose_num_splits

        return choose_num_splits(
            block_capacity(tier, requests, self._block_m), self.num_kv_head, torch.device(self.device)
        )

    def _set_ragged(self, md: RaggedTreeMetadata, width: int, bs: int) -> None:
        """Make ``md`` this forward's metadata (sglang's fields for the request slots only)."""
        self.forward_metadata = ForwardMetadata(
            attn_logits=None,
            attn_lse=None,
            max_extend_len=width,
            num_kv_splits=None,
            kv_indptr=md.kv_indptr[: bs + 1],
            kv_indices=md.kv_indices,
            qo_indptr=md.qo_indptr[: bs + 1],
            custom_mask=None,
            mask_indptr=None,
            window_kv_indptr=None,
            window_kv_indices=None,
            window_num_kv_splits=None,
            window_kv_offsets=None,
        )
        self._ragged, self._ragged_key = md, self.forward_metadata

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, *args: Any, **kwargs: Any):
        super().init_cuda_graph_state(max_bs, max_num_tokens, *args, **kwargs)
        if not self._ragged_graphs:
            return
        from .tree_attention.graph_buffers import TreeVerifyGraphBuffers

        # ECHO's verify input carries the QLEN_ONLY tree blocks; no FULL_MASK buffer to fill.
        self._verify_mask = None
        self._graph_bufs = TreeVerifyGraphBuffers(
            max_batch=max_bs,
            max_width=self.num_draft_tokens,
            kv_capacity=0,
            num_heads=self.num_head,
            head_dim=self._head_dim,
            device=self.device,
            buckets=(max_num_tokens,),
            block_m=self._block_m,
            pad_chunk=DEFAULT_PAD_CHUNK,
        )

    def init_forward_metadata_out_graph(self, forward_batch: "ForwardBatch", in_capture: bool = False):
        if not (self._ragged_graphs and forward_batch.forward_mode.is_target_verify()):
            return super().init_forward_metadata_out_graph(forward_batch, in_capture)
        request = ragged_request(forward_batch)
        width = self.num_draft_tokens
        lens, rows = torch.zeros(0, dtype=torch.int32, device=self.device), None  # a capture: every lane pads
        if request is not None:
            lens, rows, width = request
        slots, tier = forward_batch.batch_size, forward_batch.input_ids.shape[0]
        view = self._graph_bufs.view(tier, slots)
        self._fill_kv_indptr_and_indices(
            forward_batch.kv_loc_plan,
            slots,
            forward_batch.seq_lens,
            forward_batch.req_pool_indices,
            self.cuda_graph_kv_indices,
            kv_indptr=view.kv_indptr[: slots + 1],
        )
        md = self._graph_bufs.load_tier(tier, slots, lens, width, rows, self.cuda_graph_kv_indices)
        if in_capture:  # replays reuse the captured metadata: these views, refilled above
            self._set_ragged(md, width, slots)

    # -- padded verify: metadata ------------------------------------------------------------------
    def _tree_metadata(
        self, forward_batch: "ForwardBatch", num_heads: int, num_kv_heads: int, head_dim: int
    ) -> tuple[torch.Tensor, torch.Tensor, TreeAttentionPlan]:
        """(qo_indptr, packed_mask, plan) of this uniform forward, built by its first layer."""
        md = self.forward_metadata
        if self._tree_key is md and self._tree is not None:
            return self._tree
        from .tree_attention.triton_kernel import make_plan

        bs = forward_batch.req_pool_indices.numel()
        n = self._target_verify_num_tokens_per_req(forward_batch.spec_info)
        qo_indptr = md.qo_indptr[: bs + 1]
        packed = packed_tree_rows(md.custom_mask, forward_batch.seq_lens[:bs], n)  # QLEN_ONLY or FULL_MASK
        plan = make_plan(qo_indptr, bs * n, num_kv_heads, num_heads // num_kv_heads, head_dim)
        self._tree_key, self._tree = md, (qo_indptr, packed, plan)
        return self._tree

    def _qlen_only_mask(self, forward_batch: "ForwardBatch") -> bool:
        """Whether this uniform verify's mask is QLEN_ONLY (ECHO's, in ragged verify)."""
        mask = self.forward_metadata.custom_mask
        n = self._target_verify_num_tokens_per_req(forward_batch.spec_info)
        return mask is not None and mask.numel() == forward_batch.req_pool_indices.numel() * n * n

    # -- the forward ------------------------------------------------------------------------------
    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: "RadixAttention",
        forward_batch: "ForwardBatch",
        save_kv_cache: bool = True,
        sinks: Any = None,
        score_mod: Any = None,
        aux_tensors: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        verify = forward_batch.forward_mode.is_target_verify()
        ragged = verify and self._ragged is not None and self._ragged_key is self.forward_metadata
        k_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        why = unsupported_layer(layer, q, k_cache, k, v, sinks, score_mod, aux_tensors) if verify else None
        if why and (ragged or self._qlen_only_mask(forward_batch)):  # sglang's kernel reads FULL_MASK rows
            raise NotImplementedError(
                f"{BACKEND_NAME}: ECHO's ragged verify does not compute {why} (layer "
                f"{layer.layer_id}); set ECHO verify=padded (SGLANG_ECHO_VERIFY=padded)"
            )
        if not verify or why:
            return super().forward_extend(
                q,
                k,
                v,
                layer,
                forward_batch,
                save_kv_cache,
                sinks=sinks,
                score_mod=score_mod,
                aux_tensors=aux_tensors,
                **kwargs,
            )
        from .tree_attention.triton_kernel import tree_attention_triton

        if save_kv_cache:  # the tree tokens' K/V must be in the cache before the kernel reads them
            self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc.for_batch(forward_batch), k, v)
        hq, hkv, d = layer.tp_q_head_num, layer.tp_k_head_num, layer.qk_head_dim
        if ragged:
            md = self._ragged
            qo_indptr, kv_indptr, kv_indices, packed, plan = (
                md.qo_indptr,
                md.kv_indptr,
                md.kv_indices,
                md.packed_mask,
                md.plan,
            )
        else:
            qo_indptr, packed, plan = self._tree_metadata(forward_batch, hq, hkv, d)
            kv_indptr, kv_indices = self.forward_metadata.kv_indptr, self.forward_metadata.kv_indices
        o = tree_attention_triton(
            q.view(-1, hq, d),
            k_cache,
            self.token_to_kv_pool.get_value_buffer(layer.layer_id),
            qo_indptr,
            kv_indptr,
            kv_indices,
            forward_batch.out_cache_loc,
            packed,
            layer.scaling,
            plan=plan,
        )
        return o.view(-1, hq * d)
