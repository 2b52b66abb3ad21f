"""`echo_torch`: sglang AttentionBackend in pure torch (extend, decode, target verify, drafts).

Metadata conventions follow sglang's in-tree CPU backend (sglang/srt/layers/attention/
intel_amx_backend.py, `_build_extend_metadata`): in TARGET_VERIFY the batch carries no extend_*
fields, every request extends by `spec_info.draft_token_num` tokens and `forward_batch.seq_lens`
is the prefix length; an ECHO verify input marked for ragged verify gives each request its own
query count instead. EAGLE multi-step drafting sets `draft_decode_metadata` (draft.py: each
request's lanes as queries over its one KV row).

With sglang's `--enable-deterministic-inference` every mode runs the batch-invariant kernel of
`invariant.py` (a query's bits independent of the batch, decode and verify alike) instead of
the padded SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from sglang_echo.core.dense import RAGGED_MARK
from sglang_echo.platform import deterministic
from sglang_echo.platform.attention.invariant import KeyLayout, causal_layout, invariant_attention, tree_layout
from sglang_echo.platform.attention.paged_sdpa import PagedBatch, causal_mask, paged_attention, paged_batch, tree_mask

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner

    from sglang_echo.platform.attention.draft import DraftDecodeMetadata


@dataclass
class ExtendMetadata:
    q_lens: torch.Tensor  # int64 [bs]
    kv_lens: torch.Tensor  # int64 [bs], keys visible to the request incl. the new tokens
    max_q: int
    max_kv: int
    tree: Optional[torch.Tensor]  # [bs, max_q, max_kv] bool for tree verify, else None


class EchoTorchAttnBackend(AttentionBackend):
    supports_ragged_verify = True  # honours the ECHO worker's per-request verify lengths

    def __init__(self, model_runner: ModelRunner):
        super().__init__()
        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.extend_metadata: Optional[ExtendMetadata] = None
        # Set by the multi-step draft backend (draft.py) for its draft steps.
        self.draft_decode_metadata: Optional[DraftDecodeMetadata] = None
        self.deterministic = deterministic.enabled()
        # What this forward's layers share, built by its first layer: the deterministic kernel's
        # key layout, or the padded SDPA's batch per sliding window (None: none).
        self.layout: Optional[KeyLayout] = None
        self.paged: dict[Optional[int], PagedBatch] = {}

    # ---- metadata -------------------------------------------------------------------------
    def forget_layouts(self) -> None:
        """Drop what the last forward's layers shared (a new forward, or new draft-step metadata)."""
        self.layout = None
        self.paged = {}

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        mode = forward_batch.forward_mode
        self.forget_layouts()
        if mode.is_decode_or_idle():
            self.extend_metadata = None
            return
        seq_lens = forward_batch.seq_lens.to(torch.int64)
        if mode.is_target_verify():
            spec = forward_batch.spec_info
            n = spec.draft_token_num
            # Ragged verify (sglang_echo.integration.ragged): request b keeps only its first
            # lens[b] slots, whose KV sits at prefix_b + [0, lens[b]).
            lens = getattr(spec, RAGGED_MARK, None)
            q_lens = torch.full_like(seq_lens, n) if lens is None else lens.to(seq_lens)
            kv_lens = seq_lens + q_lens
            max_q, max_kv = int(q_lens.max()), int(kv_lens.max())
            # tree_topk == 1 is a chain: plain causal visibility, no mask to gather (as the
            # in-tree CPU backend does). NGRAM (-1) and EAGLE topk>1 carry a real tree, except
            # where each request verifies its root alone (max_q == 1: a plain step), which sees
            # its prefix and itself, as a decode query does.
            tree = None
            if max_q > 1 and spec.tree_topk != 1 and spec.custom_mask is not None and spec.custom_mask.numel():
                tree = tree_mask(spec.custom_mask, seq_lens, n, max_kv)[:, :max_q]
            self.extend_metadata = ExtendMetadata(q_lens, kv_lens, max_q, max_kv, tree)
            return
        q_lens = forward_batch.extend_seq_lens.to(torch.int64)
        self.extend_metadata = ExtendMetadata(q_lens, seq_lens, int(q_lens.max()), int(seq_lens.max()), None)

    # ---- forwards -------------------------------------------------------------------------
    def _save_kv(self, layer: RadixAttention, forward_batch: ForwardBatch, k, v, save: bool) -> None:
        if save and k is not None and v is not None:
            self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(forward_batch.out_cache_loc, None), k, v)

    @staticmethod
    def _check_layer(layer: RadixAttention) -> None:
        if layer.is_cross_attention or (layer.logit_cap or 0) > 0:
            raise NotImplementedError("echo_torch: cross-attention / logit soft-cap are not supported")

    def forward_extend(
        self, q, k, v, layer: RadixAttention, forward_batch: ForwardBatch, save_kv_cache: bool = True, **_: object
    ) -> torch.Tensor:
        self._check_layer(layer)
        self._save_kv(layer, forward_batch, k, v, save_kv_cache)
        md = self.extend_metadata
        window = layer.sliding_window_size if (layer.sliding_window_size or -1) > -1 else None
        if self.deterministic:
            if self.layout is None:
                r2t, req = self.req_to_token_pool.req_to_token, forward_batch.req_pool_indices
                self.layout = (
                    causal_layout(r2t, req, md.q_lens, md.kv_lens)
                    if md.tree is None
                    else tree_layout(r2t, req, md.kv_lens - md.q_lens, md.q_lens, md.tree)
                )
            return self._invariant(q, layer, window)
        batch = self.paged.get(window)
        if batch is None:
            visible = md.tree
            if visible is None:
                visible = causal_mask(md.q_lens, md.kv_lens, md.max_q, md.max_kv, window)
            r2t = self.req_to_token_pool.req_to_token
            batch = self.paged[window] = paged_batch(
                r2t, forward_batch.req_pool_indices, md.q_lens, md.kv_lens, visible
            )
        return self._paged(q, layer, batch)

    def forward_decode(
        self, q, k, v, layer: RadixAttention, forward_batch: ForwardBatch, save_kv_cache: bool = True, **_: object
    ) -> torch.Tensor:
        self._check_layer(layer)
        self._save_kv(layer, forward_batch, k, v, save_kv_cache)
        window = layer.sliding_window_size if (layer.sliding_window_size or -1) > -1 else None
        if self.deterministic:  # decode, and draft steps as one causal row per lane
            if self.layout is None:
                self.layout = causal_layout(*self._decode_rows(forward_batch))
            return self._invariant(q, layer, window)
        batch = self.paged.get(window)
        if batch is None:
            req_to_token, req_pool_indices, q_lens, kv_lens = self._decode_rows(forward_batch)
            md = self.draft_decode_metadata
            visible = None if md is None else md.window_mask(window)
            if visible is None:
                visible = causal_mask(q_lens, kv_lens, 1, int(kv_lens.max()), window)
            batch = self.paged[window] = paged_batch(req_to_token, req_pool_indices, q_lens, kv_lens, visible)
        return self._paged(q, layer, batch)

    def _decode_rows(self, forward_batch: ForwardBatch) -> tuple[torch.Tensor, ...]:
        """``(req_to_token, req_pool_indices, q_lens, kv_lens)`` of a decode step: one query per
        request over its row, or a draft step's lanes (``draft_decode_metadata``)."""
        md = self.draft_decode_metadata
        if md is not None:
            return md.req_to_token, md.req_pool_indices, md.q_lens, md.kv_lens
        kv_lens = forward_batch.seq_lens.to(torch.int64)
        return self.req_to_token_pool.req_to_token, forward_batch.req_pool_indices, torch.ones_like(kv_lens), kv_lens

    def _paged(self, q, layer: RadixAttention, batch: PagedBatch) -> torch.Tensor:
        o = paged_attention(
            q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim),
            self.token_to_kv_pool.get_key_buffer(layer.layer_id),
            self.token_to_kv_pool.get_value_buffer(layer.layer_id),
            batch,
            layer.scaling,
        )
        return o.reshape(-1, layer.tp_q_head_num * layer.v_head_dim)

    def _invariant(self, q, layer: RadixAttention, window: Optional[int]) -> torch.Tensor:
        o = invariant_attention(
            q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim),
            self.token_to_kv_pool.get_key_buffer(layer.layer_id),
            self.token_to_kv_pool.get_value_buffer(layer.layer_id),
            self.layout,
            layer.scaling,
            window,
        )
        return o.reshape(-1, layer.tp_q_head_num * layer.v_head_dim)

    def support_triton(self) -> bool:
        return False
