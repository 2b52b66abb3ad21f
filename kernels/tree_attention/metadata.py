"""Per-step metadata of tree-verify attention, built with sync-free torch ops.

The attention contract (shared by :mod:`.reference`, :mod:`.triton_kernel` and
:mod:`.flashinfer_path`) describes one verify step of ``B`` requests and ``N`` tree tokens:

* ``qo_indptr [B+1]``: request ``i`` owns query tokens ``qo_indptr[i]:qo_indptr[i+1]``
  (its ``K_i`` tree nodes, root first, topologically ordered); ``qo_indptr[B] == N``;
* ``kv_indptr [B+1]`` / ``kv_indices [>= kv_indptr[B]]``: cache slots of request ``i``'s
  already-cached prefix, every tree token sees all of them;
* ``tree_slots [N]``: cache slots where the tree tokens' own K/V were written;
* ``packed_mask [N, words]`` int32: bit ``k`` of token ``j``'s row set iff node ``k`` of its
  request is ``j`` or an ancestor of ``j`` (layout of :func:`sglang_echo.core.pack.pack`).

Everything here only uses host values that are known without a device sync (tensor shapes and
explicit capacities), so it can run inside a captured CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from sglang_echo.core.dense import full_mask_cells
from sglang_echo.core.pack import pack_bits


def lengths_to_indptr(lengths: Tensor) -> Tensor:
    """``[B]`` lengths to a ``[B+1]`` int32 CSR offset array (starts at 0)."""
    out = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device=lengths.device)
    out[1:] = lengths.cumsum(0)
    return out


def ragged_rows(indptr: Tensor, total: int) -> tuple[Tensor, Tensor]:
    """Row and in-row offset of every flat element ``0..total-1`` of a CSR layout.

    ``total`` is a host int (a capacity or a known shape); elements past ``indptr[-1]`` map to
    the last row with offsets past its end, callers mask them.
    """
    idx = torch.arange(total, device=indptr.device, dtype=torch.int64)
    ends = indptr[1:].to(torch.int64)
    row = torch.searchsorted(ends, idx, right=True).clamp(max=max(indptr.numel() - 2, 0))
    return row, idx - indptr[:-1].to(torch.int64)[row]


def gather_kv_indices(
    req_to_token: Tensor, req_pool_indices: Tensor, prefix_lens: Tensor, capacity: int
) -> tuple[Tensor, Tensor]:
    """``(kv_indptr [B+1], kv_indices [capacity])`` from sglang's ``req_to_token`` table.

    ``capacity >= sum(prefix_lens)`` is a host bound so no sync is needed; entries past the real
    total are 0 (never read: the kernels only read ``kv_indptr[i]:kv_indptr[i+1]``).
    """
    kv_indptr = lengths_to_indptr(prefix_lens)
    row, col = ragged_rows(kv_indptr, capacity)
    valid = col < prefix_lens.to(torch.int64)[row]
    slots = req_to_token[req_pool_indices.to(torch.int64)[row], col.clamp(0, req_to_token.shape[1] - 1)]
    return kv_indptr, torch.where(valid, slots, torch.zeros_like(slots)).to(torch.int32)


def unpack_bits(packed_mask: Tensor, width: int) -> Tensor:
    """Inverse of :func:`~sglang_echo.core.pack.pack_bits`: ``[N, words]`` int32 to ``[N, width]`` bool.

    Columns past ``32 * words`` are False (a narrower mask simply has no such ancestors).
    """
    n, words = packed_mask.shape
    shifts = torch.arange(32, device=packed_mask.device, dtype=torch.int64)
    bits = ((packed_mask.to(torch.int64) & 0xFFFFFFFF)[:, :, None] >> shifts) & 1
    bits = bits.reshape(n, words * 32).bool()
    if width > words * 32:
        bits = torch.nn.functional.pad(bits, (0, width - words * 32))
    return bits[:, :width]


def pack_dense_blocks(tree_mask: Tensor, mask_indptr: Tensor, qo_indptr: Tensor, num_tokens: int, width: int) -> Tensor:
    """Bit-pack a per-request dense mask (``[K_i, K_i]`` blocks row-major, offsets ``mask_indptr``).

    This is the ``tree_mask`` layout of :class:`sglang_echo.core.pack.PackedBatch` and sglang's
    QLEN_ONLY ``custom_mask``. ``num_tokens = sum K_i`` and ``width >= max K_i`` are host values
    (a shape and a tree-size cap), so no sync. Returns ``[num_tokens, ceil(width/32)]`` int32.
    """
    req, loc = ragged_rows(qo_indptr, num_tokens)
    k = (qo_indptr[1:] - qo_indptr[:-1]).to(torch.int64)[req]
    cols = torch.arange(width, device=tree_mask.device, dtype=torch.int64)
    idx = mask_indptr.to(torch.int64)[req, None] + loc[:, None] * k[:, None] + cols
    inside = cols[None, :] < k[:, None]
    dense = tree_mask.reshape(-1)[idx.clamp(0, max(tree_mask.numel() - 1, 0))].bool() & inside
    return pack_bits(dense)


def pack_full_mask_rows(custom_mask: Tensor, prefix_lens: Tensor, num_draft: int, width: int | None = None) -> Tensor:
    """Bit-pack sglang's FULL_MASK ``custom_mask`` (per request ``n`` rows of ``prefix + n``).

    Only the tree columns (``prefix .. prefix + n``) are kept: the kernels always see the whole
    prefix. Every request has ``num_draft`` tokens, as in sglang's TARGET_VERIFY.
    """
    bs, n = prefix_lens.numel(), num_draft
    width = n if width is None else width
    idx = full_mask_cells(prefix_lens.to(custom_mask.device), n, width)
    inside = (torch.arange(width, device=custom_mask.device) < n)[None, None, :].expand(bs, n, width)
    flat = custom_mask.reshape(-1)
    dense = flat[idx.clamp(0, max(flat.numel() - 1, 0))].bool() & inside
    return pack_bits(dense.reshape(bs * n, width))


@dataclass
class VerifyLayout:
    """The contract's index tensors for one verify step, plus each tree token's position."""

    qo_indptr: Tensor  # [B+1] int32
    kv_indptr: Tensor  # [B+1] int32
    kv_indices: Tensor  # [>= kv_indptr[B]] int32
    tree_slots: Tensor  # [N] int32
    packed_mask: Tensor  # [N, words] int32
    positions: Tensor  # [N] (RoPE positions)


@dataclass
class TreeAttentionPlan:
    """How the Triton kernel splits one step's work; reusable across all layers of the step.

    ``block_req[b]`` / ``block_start[b]`` give query block ``b``'s request and first token
    (``-1`` / ``0`` for unused entries of the fixed-size table); ``num_splits`` is the split-K
    factor over the prefix.
    """

    block_req: Tensor  # [num_blocks_capacity] int32
    block_start: Tensor  # [num_blocks_capacity] int32
    block_m: int
    num_splits: int

    @property
    def capacity(self) -> int:
        return self.block_req.numel()


def block_capacity(num_tokens: int, batch: int, block_m: int) -> int:
    """Upper bound on ``sum_i ceil(K_i / block_m)`` given ``sum K_i = num_tokens`` over ``batch``."""
    return -(-num_tokens // block_m) + batch


def build_block_table(
    qo_indptr: Tensor, num_tokens: int, block_m: int, out: tuple[Tensor, Tensor] | None = None
) -> tuple[Tensor, Tensor]:
    """Map a fixed grid of ``block_capacity`` query blocks onto ragged requests (no sync).

    Request ``i`` gets ``ceil(K_i / block_m)`` blocks, so no block straddles two requests and a
    block's prefix K/V tiles are loaded once for all its tokens and grouped heads.
    """
    batch = qo_indptr.numel() - 1
    cap = block_capacity(num_tokens, batch, block_m)
    sizes = (qo_indptr[1:] - qo_indptr[:-1]).to(torch.int64)
    blk_indptr = torch.zeros(batch + 1, dtype=torch.int64, device=qo_indptr.device)
    blk_indptr[1:] = ((sizes + block_m - 1) // block_m).cumsum(0)
    row, col = ragged_rows(blk_indptr, cap)
    used = torch.arange(cap, device=qo_indptr.device) < blk_indptr[-1]
    req = torch.where(used, row, torch.full_like(row, -1)).to(torch.int32)
    start = torch.where(used, qo_indptr.to(torch.int64)[row] + col * block_m, torch.zeros_like(row)).to(torch.int32)
    if out is not None:
        out[0][:cap].copy_(req)
        out[1][:cap].copy_(start)
        return out[0][:cap], out[1][:cap]
    return req, start
