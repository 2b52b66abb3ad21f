"""Batched attention over sglang's paged KV cache with an explicit per-request visibility mask.

Every attention mode reduces to: request b has q_lens[b] queries and sees keys
`req_to_token[req_b, :kv_lens[b]]`; which (query, key) pairs are visible is a bool mask
[bs, max_q, max_kv]. Requests are padded into one batch so a single SDPA call serves the
whole forward (no Python loop over requests or tokens).
"""

from __future__ import annotations

import torch
from torch.nn.functional import scaled_dot_product_attention

from sglang_echo.platform.ops.ranges import ragged_ranges


def causal_mask(
    q_lens: torch.Tensor, kv_lens: torch.Tensor, max_q: int, max_kv: int, sliding_window: int | None = None
) -> torch.Tensor:
    """Query i of request b sits at absolute position kv_len - q_len + i and sees keys <= it."""
    qpos = (kv_lens - q_lens)[:, None] + torch.arange(max_q, device=q_lens.device)[None, :]
    kpos = torch.arange(max_kv, device=q_lens.device)
    mask = kpos[None, None, :] <= qpos[:, :, None]
    if sliding_window is not None and sliding_window > 0:
        mask &= kpos[None, None, :] >= qpos[:, :, None] - sliding_window
    return mask


def tree_mask(custom_mask: torch.Tensor, prefix_lens: torch.Tensor, num_draft: int, max_kv: int) -> torch.Tensor:
    """Verify mask [bs, n, max_kv]: the whole prefix plus the draft-tree ancestor mask.

    sglang packs `custom_mask` per request, requests back to back, in one of two layouts
    (sglang/kernels/ops/speculative/spec_tree.py `TreeMaskMode`):
    - QLEN_ONLY (what sglang's CPU path builds, `default_tree_mask_mode()`): n x n per request;
    - FULL_MASK (GPU layout): n rows of (prefix_len + n) per request, prefix columns included.
    """
    n = num_draft
    dev = prefix_lens.device
    bs = prefix_lens.numel()
    prefix = prefix_lens.to(torch.int64)
    flat = custom_mask.reshape(-1)
    full_numel = int(prefix.sum()) * n + bs * n * n
    qlen_only = int(prefix.sum()) == 0 or flat.numel() < full_numel
    widths = torch.full_like(prefix, n) if qlen_only else prefix + n
    starts = torch.cumsum(widths * n, 0) - widths * n
    first_col = prefix if qlen_only else torch.zeros_like(prefix)  # key col of mask col 0
    rows = torch.arange(n, device=dev)
    keys = torch.arange(max_kv, device=dev)
    mcol = keys[None, None, :] - first_col[:, None, None]  # mask column of each key
    inside = (mcol >= 0) & (mcol < widths[:, None, None])
    idx = starts[:, None, None] + rows[None, :, None] * widths[:, None, None] + mcol
    vals = flat[idx.clamp(0, flat.numel() - 1)].to(torch.bool) & inside
    if qlen_only:
        vals |= keys[None, None, :] < prefix[:, None, None]
    return vals


def gather_rows(buffer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``buffer[slots]`` for a KV pool buffer ``[pool, ...]`` and slots of any shape. One
    ``index_select`` over the flattened slots: on the CPU 3-4x faster than advanced indexing
    (25 vs 8 us for 300 rows of 3 x 64 fp32, 678 vs 168 us for 32 x 300)."""
    return buffer.index_select(0, slots.reshape(-1)).view(*slots.shape, *buffer.shape[1:])


def paged_sdpa(
    q: torch.Tensor,  # [num_tokens, H, D], requests packed back to back
    k_buffer: torch.Tensor,  # [pool_size, Hkv, D]
    v_buffer: torch.Tensor,  # [pool_size, Hkv, Dv]
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    q_lens: torch.Tensor,
    kv_lens: torch.Tensor,
    visible: torch.Tensor,  # [bs, max_q, max_kv] bool
    scaling: float,
) -> torch.Tensor:
    """Returns [num_tokens, H, Dv]."""
    bs = q_lens.numel()
    num_heads, head_dim = q.shape[1], q.shape[2]
    max_q, max_kv = visible.shape[1], visible.shape[2]
    rows, cols = ragged_ranges(torch.zeros_like(q_lens), q_lens)

    qp = q.new_zeros(bs, max_q, num_heads, head_dim)
    qp[rows, cols] = q
    slots = req_to_token[req_pool_indices.to(torch.int64), :max_kv].to(torch.int64)
    kv_valid = torch.arange(max_kv, device=q.device)[None, :] < kv_lens[:, None]
    slots = torch.where(kv_valid, slots, 0)  # padding reads slot 0, masked out below
    k = gather_rows(k_buffer, slots).to(q.dtype)
    v = gather_rows(v_buffer, slots).to(q.dtype)

    mask = visible & kv_valid[:, None, :]
    mask[:, :, 0] |= ~mask.any(-1)  # keep padded query rows finite (their output is dropped)
    out = scaled_dot_product_attention(
        qp.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=mask[:, None],
        scale=scaling,
        enable_gqa=num_heads != k_buffer.shape[1],
    )
    return out.transpose(1, 2)[rows, cols]
