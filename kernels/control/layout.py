"""The verify layout of a step as two Triton programs per request, instead of ~100 tensor ops.

:func:`pad_pool` is :func:`sglang_echo.core.pack.pad_pool` (the node pool laid out at width W:
tokens, local parents, depths, positions, ancestor mask) and :func:`dense_from_padded` is
:func:`sglang_echo.integration.padded.dense_from_padded` (sglang's dense verify layout: padding
filled with the root, child and sibling links, sizes). Same contracts, same outputs
(``tests/kernels/test_control.py``); :class:`~sglang_echo.core.graphs.GraphedTreeBuilder` takes
them as its ``pad`` and ``finish``.

One program per request: a tree is at most a few dozen slots, so every relation (a slot's pool
source, its parent's tree slot, ancestors, first child, next sibling) is a ``[W, W]`` or
``[W, P]`` comparison in registers rather than a sort or a scatter. Ancestors are found by
following parents one level per round, W - 1 rounds at most (no data-dependent loop bound).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ...core.pack import PaddedTrees
from ...core.tree import NodePool
from ...integration.padded import DenseVerifyTensors
from .tiles import block

_NONE = tl.constexpr(1 << 30)  # "no slot" while taking minima


@triton.jit
def _pad_pool_kernel(pool_tokens, pool_parent, pool_depth, pool_valid, pool_keep, stride_p, P, prefix_lens,
                     out_tokens, out_parents, out_depth, out_positions, out_mask, out_valid, W,
                     BLOCK_P: tl.constexpr, BLOCK_W: tl.constexpr):
    b = tl.program_id(0)
    ps = tl.arange(0, BLOCK_P)
    ws = tl.arange(0, BLOCK_W)
    row = b * stride_p
    in_pool = ps < P
    kept = tl.load(pool_keep + row + ps, mask=in_pool, other=0) != 0
    kept &= tl.load(pool_valid + row + ps, mask=in_pool, other=0) != 0
    local = tl.cumsum(kept.to(tl.int32), 0) - 1  # tree slot of every kept pool slot
    hit = kept[None, :] & (local[None, :] == ws[:, None])  # [W, P]: pool slot of each tree slot
    valid = (tl.sum(hit.to(tl.int32), 1) > 0) & (ws < W)
    slot = tl.sum(tl.where(hit, ps[None, :], 0), 1)
    tokens = tl.load(pool_tokens + row + slot, mask=valid, other=0)
    depth = tl.load(pool_depth + row + slot, mask=valid, other=0)
    parent_slot = tl.load(pool_parent + row + slot, mask=valid, other=-1)
    # The parent's tree slot: kept pool slots up to it, minus one (its cumsum, read by counting).
    parent_local = tl.sum((kept[None, :] & (ps[None, :] <= parent_slot[:, None])).to(tl.int64), 1) - 1
    parents = tl.where(valid & (parent_slot >= 0), parent_local, -1)
    positions = tl.where(valid, tl.load(prefix_lens + b) + depth, 0)

    mask = (ws[:, None] == ws[None, :]) & valid[:, None]  # every slot sees itself...
    up = parents
    for _ in range(1, W):  # ...and one more ancestor level per round
        is_up = (ws[None, :] == up[:, None]) & (up[:, None] >= 0)
        mask |= is_up
        up = tl.where(up >= 0, tl.sum(tl.where(is_up, parents[None, :], 0), 1), -1)

    w_ok = ws < W
    out = b * W + ws
    tl.store(out_tokens + out, tokens, mask=w_ok)
    tl.store(out_parents + out, parents, mask=w_ok)
    tl.store(out_depth + out, depth, mask=w_ok)
    tl.store(out_positions + out, positions, mask=w_ok)
    tl.store(out_valid + out, valid, mask=w_ok)
    tl.store(out_mask + b * W * W + ws[:, None] * W + ws[None, :], mask, mask=w_ok[:, None] & w_ok[None, :])


@triton.jit
def _dense_kernel(tokens, parents, positions, tree_mask, valid, seq_lens,
                  out_tokens, out_positions, out_mask, out_next_token, out_next_sibling, out_retrieve, out_sizes, W,
                  BLOCK_W: tl.constexpr):
    b = tl.program_id(0)
    ws = tl.arange(0, BLOCK_W)
    w_ok = ws < W
    row = b * W + ws
    is_valid = (tl.load(valid + row, mask=w_ok, other=0) != 0) & w_ok
    parent = tl.load(parents + row, mask=w_ok, other=-1)
    # Padding slots: the root's token at position seq_len, seeing only itself.
    tok = tl.where(is_valid, tl.load(tokens + row, mask=w_ok, other=0), tl.load(tokens + b * W))
    pos = tl.where(is_valid, tl.load(positions + row, mask=w_ok, other=0), tl.load(seq_lens + b))
    cells = b * W * W + ws[:, None] * W + ws[None, :]
    both = w_ok[:, None] & w_ok[None, :]
    mask = (tl.load(tree_mask + cells, mask=both, other=0) != 0) | ((ws[:, None] == ws[None, :]) & ~is_valid[:, None])
    # Children in ascending slot order: the first child of j, the next sibling of c.
    child = is_valid & (parent >= 0)
    of_j = child[None, :] & (parent[None, :] == ws[:, None])
    first = tl.min(tl.where(of_j, ws[None, :], _NONE), 1)
    later = child[None, :] & child[:, None] & (parent[None, :] == parent[:, None]) & (ws[None, :] > ws[:, None])
    sibling = tl.min(tl.where(later, ws[None, :], _NONE), 1)
    tl.store(out_tokens + row, tok, mask=w_ok)
    tl.store(out_positions + row, pos, mask=w_ok)
    tl.store(out_mask + cells, mask, mask=both)
    tl.store(out_next_token + row, tl.where(first == _NONE, -1, first), mask=w_ok)
    tl.store(out_next_sibling + row, tl.where(sibling == _NONE, -1, sibling), mask=w_ok)
    tl.store(out_retrieve + row, row, mask=w_ok)
    tl.store(out_sizes + b, tl.sum(is_valid.to(tl.int32), 0))


def pad_pool(pool: NodePool, prefix_lens: Tensor, width: int) -> PaddedTrees:
    """:func:`sglang_echo.core.pack.pad_pool` as one program per request."""
    B, P, W, dev = pool.batch_size, pool.size, width, pool.tokens.device
    if any(getattr(pool, f).stride(1) != 1 or getattr(pool, f).stride(0) != pool.tokens.stride(0)
           for f in ("parent", "depth", "valid", "keep")):
        raise ValueError("pad_pool: the pool's fields must share one row-major layout")
    out = PaddedTrees(tokens=torch.empty(B, W, dtype=torch.int64, device=dev),
                      parents=torch.empty(B, W, dtype=torch.int64, device=dev),
                      depth=torch.empty(B, W, dtype=torch.int64, device=dev),
                      positions=torch.empty(B, W, dtype=torch.int64, device=dev),
                      mask=torch.empty(B, W, W, dtype=torch.bool, device=dev),
                      valid=torch.empty(B, W, dtype=torch.bool, device=dev))
    _pad_pool_kernel[(B,)](pool.tokens, pool.parent, pool.depth, pool.valid, pool.keep, pool.tokens.stride(0), P,
                           prefix_lens.long().contiguous(), out.tokens, out.parents, out.depth, out.positions,
                           out.mask, out.valid, W, BLOCK_P=block(P), BLOCK_W=block(W), num_warps=_warps(W))
    return out


def dense_from_padded(padded: PaddedTrees, seq_lens: Tensor) -> DenseVerifyTensors:
    """:func:`sglang_echo.integration.padded.dense_from_padded` (QLEN_ONLY mask) as one program
    per request."""
    B, W = padded.valid.shape
    dev = padded.valid.device
    flat = lambda dtype: torch.empty(B * W, dtype=dtype, device=dev)  # noqa: E731
    tree_mask = torch.empty(B, W, W, dtype=torch.bool, device=dev)
    out = DenseVerifyTensors(draft_token=flat(torch.int64), positions=flat(torch.int64),
                             custom_mask=tree_mask.view(-1), retrieve_index=flat(torch.int64).view(B, W),
                             retrieve_next_token=flat(torch.int64).view(B, W),
                             retrieve_next_sibling=flat(torch.int64).view(B, W), tree_mask=tree_mask,
                             valid=padded.valid, sizes=torch.empty(B, dtype=torch.int32, device=dev))
    tokens, parents, positions, mask, valid = (t.contiguous() for t in (
        padded.tokens, padded.parents, padded.positions, padded.mask, padded.valid))
    _dense_kernel[(B,)](tokens, parents, positions, mask, valid, seq_lens.long().contiguous(),
                        out.draft_token, out.positions, out.tree_mask, out.retrieve_next_token,
                        out.retrieve_next_sibling, out.retrieve_index, out.sizes, W,
                        BLOCK_W=block(W), num_warps=_warps(W))
    return out


def _warps(width: int) -> int:
    return 1 if width <= 16 else 2 if width <= 32 else 4
