"""``echo_tree_triton``: sglang attention backend whose TARGET_VERIFY runs our Triton tree kernel.

A thin adapter over sglang 0.5.23's in-tree :class:`TritonAttnBackend`: prefill, decode, draft
modes and all CUDA-graph state are inherited unchanged; only ``forward_extend`` in TARGET_VERIFY
mode is replaced. The inherited target-verify metadata already matches our contract
(``kv_indptr / kv_indices`` = each request's cached prefix, the draft tokens' K/V are written at
``out_cache_loc`` before attention); the only conversion is sglang's byte ``custom_mask`` (FULL_MASK
layout on GPU: per request ``n`` rows of ``prefix + n``; QLEN_ONLY: ``n x n``) into our bit-packed
rows, done once per forward (cached on the metadata object) and reused by every layer.

Registered by the ECHO plugin through :mod:`..registration` (this module is imported only when a
server selects ``--attention-backend echo_tree_triton``). GPU-only at runtime.

Not done (see kernels/README.md): ECHO's ragged ``qo_indptr`` cannot reach this backend because
sglang's TARGET_VERIFY is uniform (``num_tokens_per_req`` per request), so this adapter runs the
kernel on sglang's uniform layout; sliding-window layers, attention sinks, logit soft-cap and
``score_mod`` fall back to the inherited Triton path; the per-forward mask conversion is captured
into sglang's verify CUDA graphs by construction (sync-free ops on static buffers) but that has
not been exercised on a GPU yet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch

from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from .registration import BACKEND_NAME  # noqa: F401  (re-exported)
from .tree_attention.metadata import TreeAttentionPlan, pack_dense_blocks, pack_full_mask_rows

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch



def create_backend(runner: Any) -> "EchoTreeVerifyBackend":
    """Factory behind the ``echo_tree_triton`` registry entry (see :mod:`..registration`)."""
    return EchoTreeVerifyBackend(runner)


class EchoTreeVerifyBackend(TritonAttnBackend):
    """sglang's Triton backend with the TARGET_VERIFY attention swapped for the tree kernel."""

    def __init__(self, model_runner: Any, *args: Any, **kwargs: Any):
        super().__init__(model_runner, *args, **kwargs)
        self._tree_key: Optional[object] = None  # the forward_metadata the cache below belongs to
        self._tree: Optional[tuple[torch.Tensor, torch.Tensor, TreeAttentionPlan]] = None

    def _tree_metadata(self, forward_batch: "ForwardBatch", num_heads: int, num_kv_heads: int,
                       head_dim: int) -> tuple[torch.Tensor, torch.Tensor, TreeAttentionPlan]:
        """(qo_indptr, packed_mask, plan) of this forward, built by its first layer."""
        md = self.forward_metadata
        if self._tree_key is md and self._tree is not None:
            return self._tree
        from .tree_attention.triton_kernel import make_plan

        bs = forward_batch.req_pool_indices.numel()
        n = self._target_verify_num_tokens_per_req(forward_batch.spec_info)
        qo_indptr = md.qo_indptr[: bs + 1]
        mask = md.custom_mask
        vm = self.verify_mask
        qlen_only = vm is not None and getattr(vm.mode, "name", "") == "QLEN_ONLY"
        if qlen_only:
            mask_indptr = torch.arange(bs + 1, device=mask.device, dtype=torch.int64) * (n * n)
            packed = pack_dense_blocks(mask, mask_indptr, qo_indptr, bs * n, n)
        else:
            packed = pack_full_mask_rows(mask, forward_batch.seq_lens[:bs], n)
        plan = make_plan(qo_indptr, bs * n, num_kv_heads, num_heads // num_kv_heads, head_dim)
        self._tree_key, self._tree = md, (qo_indptr, packed, plan)
        return self._tree

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: "RadixAttention",
                       forward_batch: "ForwardBatch", save_kv_cache: bool = True, sinks: Any = None,
                       score_mod: Any = None, aux_tensors: Any = None, **kwargs: Any) -> torch.Tensor:
        unsupported = (sinks is not None or score_mod is not None or aux_tensors is not None
                       or (layer.sliding_window_size or -1) > -1 or (layer.logit_cap or 0) > 0
                       or layer.qk_head_dim != layer.v_head_dim or k is None or v is None
                       or self.token_to_kv_pool.get_key_buffer(layer.layer_id).dtype != q.dtype)  # fp8 KV
        if not forward_batch.forward_mode.is_target_verify() or unsupported:
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, sinks=sinks,
                                          score_mod=score_mod, aux_tensors=aux_tensors, **kwargs)
        from .tree_attention.triton_kernel import tree_attention_triton

        if save_kv_cache:  # the tree tokens' K/V must be in the cache before the kernel reads them
            self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc.for_batch(forward_batch), k, v)
        hq, hkv, d = layer.tp_q_head_num, layer.tp_k_head_num, layer.qk_head_dim
        qo_indptr, packed, plan = self._tree_metadata(forward_batch, hq, hkv, d)
        md = self.forward_metadata
        o = tree_attention_triton(
            q.view(-1, hq, d),
            self.token_to_kv_pool.get_key_buffer(layer.layer_id),
            self.token_to_kv_pool.get_value_buffer(layer.layer_id),
            qo_indptr, md.kv_indptr, md.kv_indices, forward_batch.out_cache_loc, packed, layer.scaling,
            plan=plan,
        )
        return o.view(-1, hq * d)
