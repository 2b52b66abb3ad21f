"""Flatten & pack (ECHO Sec. 3.1, Fig. 3 step 4): the kernel-facing layout of a ragged batch.

Request i contributes its K_i tree nodes (root first) to one flat verify batch. Each node attends
to the request's cached prefix plus its own ancestors in the tree. :func:`pack` produces:

* ``qo_indptr [B+1]`` and ``positions [N] = prefix_len + depth`` for the ragged batch;
* the tree mask, dense per request (``tree_mask``, the ``[K_i, K_i]`` blocks concatenated
  row-major, offsets in ``mask_indptr``) and bit-packed (``packed_mask [N, ceil(W/32)]`` int32,
  bit k of node j's row set iff node k of its request is j or an ancestor of j);
* SGLang's retrieve arrays ``retrieve_index`` (global node per local slot),
  ``retrieve_next_token`` (first child) and ``retrieve_next_sibling`` (next sibling), ``[B, W]``;
* a padded view ``[B, W]`` (W = widest tree, or a fixed cap) for engines that need equal widths.

Everything is built with batched tensor ops and at most two host syncs (the widest tree, and the
size of the ragged ``tree_mask``); the only Python loop runs ``ceil(log2 W)`` times.
:func:`pad_pool` builds the padded view at a fixed width from the node pool, before compaction,
with none (what a CUDA graph can capture, :mod:`sglang_echo.core.graphs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from .tree import DraftTrees, NodePool


@dataclass
class PaddedTrees:
    """Every tree padded to ``W`` slots; padding slots are invalid and attend to nothing."""

    tokens: Tensor  # [B, W] int64 (0 in padding)
    parents: Tensor  # [B, W] int64 local, -1 for roots and padding
    depth: Tensor  # [B, W] int64 (0 in padding)
    positions: Tensor  # [B, W] int64
    mask: Tensor  # [B, W, W] bool ancestor-or-self mask
    valid: Tensor  # [B, W] bool


@dataclass
class PackedBatch:
    qo_indptr: Tensor  # [B+1]
    positions: Tensor  # [N]
    tree_mask: Tensor  # [sum K_i^2] bool
    mask_indptr: Tensor  # [B+1]
    packed_mask: Tensor  # [N, ceil(W/32)] int32
    retrieve_index: Tensor  # [B, W] global node index, -1 in padding
    retrieve_next_token: Tensor  # [B, W] local index of the first child, -1 if none
    retrieve_next_sibling: Tensor  # [B, W] local index of the next sibling, -1 if none
    padded: PaddedTrees

    @property
    def width(self) -> int:
        return self.retrieve_index.shape[1]


def pad_trees(trees: DraftTrees, prefix_lens: Tensor, width: Optional[int] = None) -> PaddedTrees:
    """Scatter the CSR batch into ``[B, W]`` slots (slot = local node index)."""
    B, sizes = trees.batch_size, trees.sizes
    widest = int(sizes.max()) if B else 0  # one host sync: W, or the check that W holds every tree
    W = widest if width is None else width
    if widest > W:
        raise ValueError(f"a tree has {widest} nodes, more than the padded width {W}")
    req, loc = trees.request_of_node, trees.local_index
    dev = trees.tokens.device

    def scatter(values: Tensor, fill: int) -> Tensor:
        out = torch.full((B, W), fill, dtype=values.dtype, device=dev)
        out[req, loc] = values
        return out

    valid = scatter(torch.ones_like(trees.tokens, dtype=torch.bool), False)
    return _padded(scatter(trees.tokens, 0), scatter(trees.parents, -1), scatter(trees.depth, 0), valid, prefix_lens)


def pad_pool(pool: NodePool, prefix_lens: Tensor, width: int) -> PaddedTrees:
    """:func:`pad_trees` of ``pool.compact()``, laid out straight from the pool: no host sync.

    The kept slots of a request take tree slots in pool order, which is the compacted order (the
    pool grows depth by depth, so parents precede children). A tree of more than ``width`` nodes
    keeps its first ``width``, which is still ancestor-closed for the same reason; the policies
    size ``width`` so that this never happens.
    """
    B, P, W, dev = pool.batch_size, pool.size, width, pool.tokens.device
    keep = pool.keep & pool.valid
    local = keep.long().cumsum(1) - 1  # tree slot of every kept pool slot
    col = torch.where(keep & (local < W), local, W)  # everything else lands in a spare column
    slot = torch.full((B, W + 1), -1, dtype=torch.int64, device=dev)
    slot = slot.scatter_(1, col, torch.arange(P, device=dev).expand(B, P))[:, :W]
    valid, safe = slot >= 0, slot.clamp(min=0)
    pick = lambda t, fill: torch.where(valid, t.gather(1, safe), fill)  # noqa: E731
    parent_slot = pool.parent.gather(1, safe)
    parents = torch.where(valid & (parent_slot >= 0), local.gather(1, parent_slot.clamp(min=0)), -1)
    return _padded(pick(pool.tokens, 0), parents, pick(pool.depth, 0), valid, prefix_lens)


def _padded(tokens: Tensor, parents: Tensor, depth: Tensor, valid: Tensor, prefix_lens: Tensor) -> PaddedTrees:
    """:class:`PaddedTrees` from its slots: positions and the ancestor mask follow from them."""
    return PaddedTrees(
        tokens=tokens,
        parents=parents,
        depth=depth,
        positions=torch.where(valid, prefix_lens.reshape(-1, 1) + depth, 0),
        mask=ancestor_mask(parents, valid),
        valid=valid,
    )


def ancestor_mask(parents: Tensor, valid: Tensor) -> Tensor:
    """``mask[b, j, k]`` iff slot k is slot j or one of its ancestors.

    Rows are int64 bitsets (``ceil(W/64)`` words) built by pointer doubling: after round ``t`` a
    row holds every ancestor closer than ``2^t`` and ``jump`` points ``2^t`` levels up, so row
    ``j`` ORs in the row of ``jump[j]``. ``ceil(log2 W)`` rounds (known from the shape, not the
    data) reach every ancestor without a host sync.
    """
    B, W = parents.shape
    words = max(-(-W // 64), 1)
    dev = parents.device
    one_bit = torch.bitwise_left_shift(torch.ones(64, dtype=torch.int64, device=dev), torch.arange(64, device=dev))
    own = torch.eye(words * 64, W, dtype=torch.int64, device=dev).T.reshape(W, words, 64)  # slot j's bit
    bits = torch.where(valid[:, :, None], (own * one_bit).sum(-1), 0)  # [B, W, words]; bit 63 is the sign
    jump = parents
    for _ in range(max(W - 1, 1).bit_length()):
        has = jump >= 0
        up = jump.clamp(min=0)
        bits = bits | torch.where(has[:, :, None], bits.gather(1, up[:, :, None].expand(B, W, words)), 0)
        jump = torch.where(has, jump.gather(1, up), jump)
    cols = [(bits[:, :, w, None] & one_bit[: min(64, W - 64 * w)]) != 0 for w in range(words)]
    return torch.cat(cols, 2) if words > 1 else cols[0]


def child_links(parents: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """SGLang's ``retrieve_next_token`` / ``retrieve_next_sibling`` from padded parents.

    Children are listed in ascending slot order: a node's first child is its smallest child slot,
    and each child's next sibling the next larger slot with the same parent. Sync-free: every slot
    takes part in the sort (non-children last), and writes that do not apply go to a spare cell.
    """
    B, W = parents.shape
    dev = parents.device
    slot = torch.arange(W, device=dev).expand(B, W)
    is_child = valid & (parents >= 0)
    # Sort children by (request, parent, slot): consecutive entries of one group are siblings.
    key = (torch.arange(B, device=dev)[:, None] * (W + 1) + parents + 1) * W + slot
    key = torch.where(is_child, key, torch.iinfo(torch.int64).max)
    order = key.flatten().argsort()
    b, s = order // W, order % W
    child = is_child.flatten()[order]
    p = parents[b, s]
    same = child[1:] & child[:-1] & (b[1:] == b[:-1]) & (p[1:] == p[:-1])
    spare = B * W
    next_sibling = torch.full((spare + 1,), -1, dtype=torch.int64, device=dev)
    next_sibling[torch.where(same, order[:-1], spare)] = s[1:]
    first = child.clone()
    first[1:] &= ~same
    next_token = torch.full((spare + 1,), -1, dtype=torch.int64, device=dev)
    next_token[torch.where(first, b * W + p.clamp(min=0), spare)] = s
    return next_token[:spare].view(B, W), next_sibling[:spare].view(B, W)


def pack_bits(mask: Tensor) -> Tensor:
    """Pack ``[..., W]`` bool rows into ``[..., ceil(W/32)]`` int32 words, bit k = column k."""
    W = mask.shape[-1]
    words = -(-W // 32) if W else 0
    padded = torch.nn.functional.pad(mask, (0, words * 32 - W)).view(*mask.shape[:-1], words, 32)
    # A float64 dot product with powers of two is exact below 2^53 and much faster on CPU than
    # an int64 shift-and-sum reduction.
    weights = 2.0 ** torch.arange(32, dtype=torch.float64, device=mask.device)
    v = (padded.to(torch.float64) @ weights).long()
    return torch.where(v >= 2**31, v - 2**32, v).to(torch.int32)  # bit 31 is the sign bit


def pack(trees: DraftTrees, prefix_lens: Tensor, width: Optional[int] = None) -> PackedBatch:
    """Build the ragged and padded verify layouts of ``trees`` (see the module docstring)."""
    padded = pad_trees(trees, prefix_lens, width)
    B, W = padded.valid.shape
    req, loc = trees.request_of_node, trees.local_index  # the valid slots, in CSR order
    pair = padded.valid[:, :, None] & padded.valid[:, None, :]
    sizes = trees.sizes
    mask_indptr = torch.zeros(B + 1, dtype=torch.int64, device=sizes.device)
    mask_indptr[1:] = (sizes * sizes).cumsum(0)
    next_token, next_sibling = child_links(padded.parents, padded.valid)
    retrieve_index = torch.full((B, W), -1, dtype=torch.int64, device=sizes.device)
    retrieve_index[req, loc] = torch.arange(trees.num_nodes, device=sizes.device)
    return PackedBatch(
        qo_indptr=trees.indptr.clone(),
        positions=padded.positions[req, loc],
        tree_mask=padded.mask[pair],
        mask_indptr=mask_indptr,
        packed_mask=pack_bits(padded.mask[req, loc]),
        retrieve_index=retrieve_index,
        retrieve_next_token=next_token,
        retrieve_next_sibling=next_sibling,
        padded=padded,
    )
