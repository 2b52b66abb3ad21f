"""Ragged tree-verify metadata for one token tier: ECHO's ``sum K_i`` nodes padded up to ``T`` lanes.

A compact verify forward holds ``N = sum_b K_b`` real tree nodes, request-major (request ``b``'s
nodes ``0..K_b-1`` in its dense slot order), then ``T - N`` padding lanes (``T`` is a CUDA-graph
token tier, or ``N`` itself when the forward runs eagerly). The attention metadata of such a
forward (the contract of :mod:`.metadata`) is laid out over three groups of requests:

* ``slots`` request slots: the ``B <= slots`` real requests (``K_b`` queries over their cached
  prefix), then empty ones (no query; a captured graph's unused request slots);
* :func:`padding_requests` padding requests of at most ``pad_chunk`` lanes each, covering lanes
  ``[N, T)``: no prefix and an all-zero mask row, so every padding lane attends to nothing and
  outputs exactly 0 (see :mod:`.graph_buffers`), and no real request sees them;
* a request with no lanes left is empty (its block count is 0).

The request count ``slots + padding_requests(T)`` and every shape depend only on host values
(``T``, ``slots``, ``W``), never on ``N`` or ``K``: the same code builds a graph's metadata at
capture (no real request: every lane pads) and before each replay, into the same static views,
with device ops only (no host sync).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from sglang_echo.core.pack import pack_bits

from .metadata import TreeAttentionPlan, block_capacity, build_block_table, pack_full_mask_rows, ragged_rows

DEFAULT_PAD_CHUNK = 32


def padding_requests(tier: int, pad_chunk: int = DEFAULT_PAD_CHUNK) -> int:
    """Padding requests of a ``tier``-lane layout: enough for a tier with no real lane."""
    return -(-tier // pad_chunk)


def lane_map(lens: Tensor, width: int, lanes: int) -> Tensor:
    """``[lanes]`` int64: lane ``t`` of the request-major packing of ``lens[b]`` nodes per request
    holds dense slot ``b * width + j`` (node ``j`` of request ``b``); ``-1`` past ``sum(lens)``.

    Zero-length requests take no lane. Sync-free (``lanes`` is a host value)."""
    lens = lens.to(torch.int64)
    out = torch.full((lanes,), -1, dtype=torch.int64, device=lens.device)
    if lens.numel() == 0 or lanes == 0:
        return out
    indptr = torch.zeros(lens.numel() + 1, dtype=torch.int64, device=lens.device)
    indptr[1:] = lens.cumsum(0)
    req, within = ragged_rows(indptr, lanes)
    real = torch.arange(lanes, device=lens.device) < indptr[-1]
    return torch.where(real, req * width + within, out)


def packed_tree_rows(tree_mask: Tensor, prefix_lens: Tensor, width: int) -> Tensor:
    """Bit-packed dense tree rows ``[B*W, ceil(W / 32)]`` of ``B = prefix_lens.numel()`` requests.

    ``tree_mask`` is sglang's ``custom_mask`` of a ``W``-wide verify, bool or bytes: QLEN_ONLY
    (``[B*W*W]``, row ``b*W + j`` = which nodes of request ``b`` node ``j`` sees) or FULL_MASK
    (per request ``W`` rows of ``prefix_b + W`` cells), told apart by size: a FULL_MASK row also
    holds its prefix, at least one token in a decode step. Sync-free."""
    b = prefix_lens.numel()
    if tree_mask.numel() == b * width * width:
        return pack_bits(tree_mask.reshape(b * width, width).bool())
    return pack_full_mask_rows(tree_mask, prefix_lens, width)


def lane_mask(tree_rows: Optional[Tensor], lanes: Tensor, words: int) -> Tensor:
    """The packed tree rows of the lanes, ``[T, words]`` int32: lane ``t`` takes dense row
    ``lanes[t]`` of ``tree_rows`` (:func:`packed_tree_rows`). Bit ``k`` of a lane is node ``k`` of
    its request, which is column ``k`` of its dense row because a request's real nodes keep their
    slot order. Padding lanes (``-1``) get zero rows, and so do all lanes without ``tree_rows``
    (a graph capture)."""
    out = torch.zeros(lanes.numel(), words, dtype=torch.int32, device=lanes.device)
    if tree_rows is None or tree_rows.numel() == 0:
        return out
    picked = tree_rows[lanes.clamp(min=0)]
    out[:, : picked.shape[1]] = torch.where((lanes >= 0)[:, None], picked, 0)
    return out


def tier_indptrs(lens: Tensor, slots: int, tier: int, pad_chunk: int, qo_out: Tensor, kv_out: Tensor) -> None:
    """Fill ``qo_out`` / ``kv_out`` (``[slots + padding_requests(tier) + 1]``) in place.

    ``kv_out[:slots + 1]`` must already hold the request slots' prefix offsets (sglang fills them
    from ``seq_lens``); padding requests get no prefix. ``lens`` (``[B]``, ``B <= slots``) are the
    real requests' node counts; request slots past ``B`` get none. Sync-free."""
    b = lens.numel()
    pads = padding_requests(tier, pad_chunk)
    if b > slots:
        raise ValueError(f"{b} requests exceed the {slots} request slots of tier {tier}")
    if qo_out.numel() != slots + pads + 1 or kv_out.numel() != slots + pads + 1:
        raise ValueError(f"indptr views of {qo_out.numel()} / {kv_out.numel()} entries, want {slots + pads + 1}")
    qo_out[:1].zero_()
    qo_out[1 : b + 1].copy_(lens.cumsum(0))
    qo_out[b + 1 : slots + 1].copy_(qo_out[b : b + 1].expand(slots - b))
    steps = torch.arange(1, pads + 1, device=qo_out.device, dtype=torch.int64) * pad_chunk
    qo_out[slots + 1 :].copy_((qo_out[slots].to(torch.int64) + steps).clamp(max=tier))
    kv_out[slots + 1 :].copy_(kv_out[slots : slots + 1].expand(pads))


@dataclass
class RaggedTreeMetadata:
    """The tree kernel's arguments for one compact verify forward (besides Q, the caches and
    ``tree_slots``, which are the forward's KV write ids)."""

    qo_indptr: Tensor  # [R+1]: slots, then padding requests; qo_indptr[R] == tier
    kv_indptr: Tensor  # [R+1]
    kv_indices: Tensor  # prefix slots, read through kv_indptr
    packed_mask: Tensor  # [tier, words] int32
    plan: TreeAttentionPlan
    lanes: Tensor  # [tier] dense slot of each lane, -1 on padding

    @property
    def tier(self) -> int:
        return self.packed_mask.shape[0]


def tier_metadata(
    lens: Tensor,
    width: int,
    tier: int,
    slots: int,
    tree_rows: Optional[Tensor],
    kv_indptr: Tensor,
    kv_indices: Tensor,
    *,
    block_m: int,
    pad_chunk: int = DEFAULT_PAD_CHUNK,
    num_splits: int = 1,
    qo_indptr: Optional[Tensor] = None,
    packed_mask: Optional[Tensor] = None,
    blocks: Optional[tuple[Tensor, Tensor]] = None,
) -> RaggedTreeMetadata:
    """Metadata of a ``tier``-lane compact forward of ``lens`` nodes per request (see the module doc).

    ``tree_rows`` are the requests' packed dense tree rows (:func:`packed_tree_rows`; None: no real
    request). ``kv_indptr`` (``[slots + padding_requests(tier) + 1]``) holds the request slots'
    prefix offsets in its head; ``qo_indptr`` / ``packed_mask`` (``[tier, words]``) / ``blocks``
    (``block_req, block_start`` of ``block_capacity(tier, R, block_m)`` entries) are written in
    place when given (a graph's static views), else allocated. Sync-free."""
    r = slots + padding_requests(tier, pad_chunk)
    dev = kv_indptr.device
    lens = lens.to(dev)
    if qo_indptr is None:
        qo_indptr = torch.zeros(r + 1, dtype=torch.int32, device=dev)
    tier_indptrs(lens, slots, tier, pad_chunk, qo_indptr, kv_indptr)
    lanes = lane_map(lens, width, tier)
    words = max(1, -(-width // 32)) if packed_mask is None else packed_mask.shape[1]
    packed = lane_mask(tree_rows, lanes, words)
    if packed_mask is None:
        packed_mask = packed
    else:
        packed_mask.copy_(packed)
    if blocks is None:
        cap = block_capacity(tier, r, block_m)
        blocks = (torch.empty(cap, dtype=torch.int32, device=dev), torch.empty(cap, dtype=torch.int32, device=dev))
    block_req, block_start = build_block_table(qo_indptr, tier, block_m, out=blocks)
    plan = TreeAttentionPlan(block_req, block_start, block_m, num_splits)
    return RaggedTreeMetadata(qo_indptr, kv_indptr, kv_indices, packed_mask, plan, lanes)
