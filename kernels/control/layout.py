"""The verify layout of a step as two Triton programs per request, instead of ~100 tensor ops.

:func:`pad_pool` is :func:`sglang_echo.core.pack.pad_pool` (the node pool laid out at width W:
tokens, local parents, depths, positions, ancestor mask) and :func:`dense_from_padded` is
:func:`sglang_echo.core.dense.dense_from_padded` (sglang's dense verify layout: padding
filled with the root, child and sibling links, sizes). Same contracts, same outputs
(``tests/kernels/test_control.py``); :class:`~sglang_echo.core.graphs.GraphedTreeBuilder` takes
them as its ``pad`` and ``finish``.

One program per request: a tree is at most a few dozen slots, so every relation (a slot's pool
source, its parent's tree slot, ancestors, first child, next sibling) is a ``[W, P]`` or
``[W, W]`` comparison in registers rather than a sort or a scatter. Ancestors are found by
following parents one level per round, W - 1 rounds at most (no data-dependent loop bound).

No boolean crosses register layouts. Triton 3.6 lowers some intra-warp layout conversions of
8-bit values (``i1``/``i8``: packed four to a register and byte-permuted) wrongly on sm_90, and
a boolean reaching a ``[W, W]`` tile from a ``[W, P]`` one (or a row vector used as a column)
is such a conversion. So the kernels never ask for one:

* every 2-D tile of a program has one shape (``[W, P]`` in the first part of :func:`pad_pool`,
  ``[W, W]`` in its mask and in :func:`dense_from_padded`); a per-column quantity is loaded as
  that whole tile (each row reads the same row of memory), a per-row one is a reduction over
  the tile's columns; nothing is transposed;
* :func:`pad_pool` stores the slots first and builds the mask from the parents read back as a
  ``[W, W]`` tile after a barrier, so the mask tile takes nothing from the ``[W, P]`` tile's
  registers; validity is a count (slot w is valid iff w < the number of kept slots, capped at
  W), a scalar that every tile and the stores compare with.

``tests/kernels/test_control.py`` checks the compiled sm_90 TTGIR for narrow conversions.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from ...core.dense import DenseVerifyTensors
from ...core.pack import PaddedTrees
from ...core.tree import NodePool
from .tiles import block

_NONE = tl.constexpr(1 << 30)  # "no slot" while taking minima
_LOOSE = ["stride_p", "P", "W"]  # never specialised: one compiled layout per tile size, whatever the values


@triton.jit
def _columns(ptr, base, W, other, BLOCK_W: tl.constexpr):
    """``t[i, j] = ptr[base + j]`` for ``j < W`` as a ``[W, W]`` tile (row-major, one layout)."""
    rows = tl.arange(0, BLOCK_W)[:, None]
    cols = tl.arange(0, BLOCK_W)[None, :]
    return tl.load(ptr + base + cols + rows * 0, mask=(cols < W) & (rows >= 0), other=other)


@triton.jit(do_not_specialize=_LOOSE)
def _pad_pool_kernel(
    pool_tokens,
    pool_parent,
    pool_depth,
    pool_valid,
    pool_keep,
    stride_p,
    P,
    prefix_lens,
    out_tokens,
    out_parents,
    out_depth,
    out_positions,
    out_mask,
    out_valid,
    W,
    BLOCK_P: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    b = tl.program_id(0)
    row = b * stride_p
    # Part 1, [W, P]: the pool row read as a whole tile; tree slot w takes the w-th kept pool slot.
    ws = tl.arange(0, BLOCK_W)
    tw = ws[:, None]
    tp = tl.arange(0, BLOCK_P)[None, :] + tw * 0
    in_pool = tp < P
    keep = tl.load(pool_keep + row + tp, mask=in_pool, other=0)
    alive = tl.load(pool_valid + row + tp, mask=in_pool, other=0)
    kept = tl.where((keep != 0) & (alive != 0), 1, 0)  # int32 0/1
    local = tl.cumsum(kept, 1) - 1  # tree slot of every kept pool slot (each row the same)
    hit = (kept != 0) & (local == tw)
    n_valid = tl.minimum(tl.max(tl.sum(kept, 1), 0), W)  # slots 0 .. n_valid - 1 hold a kept pool slot
    valid = ws < n_valid
    slot = tl.sum(tl.where(hit, tp, 0), 1)  # 0 where no slot: always a readable pool column
    tokens = tl.where(valid, tl.load(pool_tokens + row + slot), 0)
    depth = tl.where(valid, tl.load(pool_depth + row + slot), 0)
    parent_slot = tl.where(valid, tl.load(pool_parent + row + slot), -1)
    # The parent's tree slot: kept pool slots up to it, minus one (its cumsum, read by counting).
    parent_local = tl.sum(tl.where(tp <= parent_slot[:, None], kept, 0), 1) - 1
    parents = tl.where(parent_slot >= 0, parent_local, -1).to(tl.int64)
    positions = tl.where(valid, tl.load(prefix_lens + b) + depth, 0)
    w_ok = ws < W
    out = b * W + ws
    tl.store(out_tokens + out, tokens, mask=w_ok)
    tl.store(out_parents + out, parents, mask=w_ok)
    tl.store(out_depth + out, depth, mask=w_ok)
    tl.store(out_positions + out, positions, mask=w_ok)
    tl.store(out_valid + out, valid, mask=w_ok)
    tl.debug_barrier()  # the slots are in memory for every thread of the program

    # Part 2, [W, W]: mask[j, k] iff k is j or an ancestor of j, one parent level per round.
    rows = tl.arange(0, BLOCK_W)[:, None]
    cols = tl.arange(0, BLOCK_W)[None, :]
    par = _columns(out_parents, b * W, W, -1, BLOCK_W)  # par[j, k] = parent of k
    eye = rows == cols
    mask = eye & (cols < n_valid)  # every valid slot sees itself...
    up = tl.sum(tl.where(eye, par, 0), 1)  # the parent of row j
    for _ in range(1, W):  # ...and one more ancestor level per round
        is_up = (cols == up[:, None]) & (up[:, None] >= 0)
        mask |= is_up
        up = tl.where(up >= 0, tl.sum(tl.where(is_up, par, 0), 1), -1)
    tl.store(out_mask + b * W * W + rows * W + cols, mask, mask=(rows < W) & (cols < W))


@triton.jit(do_not_specialize=["W"])
def _dense_kernel(
    tokens,
    parents,
    positions,
    tree_mask,
    valid,
    seq_lens,
    out_tokens,
    out_positions,
    out_mask,
    out_next_token,
    out_next_sibling,
    out_retrieve,
    out_sizes,
    W,
    BLOCK_W: tl.constexpr,
):
    b = tl.program_id(0)
    ws = tl.arange(0, BLOCK_W)
    rows = ws[:, None]
    cols = tl.arange(0, BLOCK_W)[None, :]
    eye = rows == cols
    # Column k of every row: slot k's validity and parent; a row's own values are the diagonal.
    valid_k = _columns(valid, b * W, W, 0, BLOCK_W) != 0
    parent_k = _columns(parents, b * W, W, -1, BLOCK_W)
    is_valid = tl.sum(tl.where(eye & valid_k, 1, 0), 1) > 0
    parent_j = tl.sum(tl.where(eye, parent_k, 0), 1)
    w_ok = ws < W
    row = b * W + ws
    # Padding slots: the root's token at position seq_len, seeing only itself.
    tok = tl.where(is_valid, tl.load(tokens + row, mask=w_ok, other=0), tl.load(tokens + b * W))
    pos = tl.where(is_valid, tl.load(positions + row, mask=w_ok, other=0), tl.load(seq_lens + b))
    cells = b * W * W + rows * W + cols
    both = (rows < W) & (cols < W)
    mask = (tl.load(tree_mask + cells, mask=both, other=0) != 0) | (eye & ~valid_k)
    # Children in ascending slot order: the first child of j, the next sibling of c.
    child_k = valid_k & (parent_k >= 0)
    first = tl.min(tl.where(child_k & (parent_k == rows), cols, _NONE), 1)
    child_j = is_valid & (parent_j >= 0)
    later = child_k & child_j[:, None] & (parent_k == parent_j[:, None]) & (cols > rows)
    sibling = tl.min(tl.where(later, cols, _NONE), 1)
    tl.store(out_tokens + row, tok, mask=w_ok)
    tl.store(out_positions + row, pos, mask=w_ok)
    tl.store(out_mask + cells, mask, mask=both)
    tl.store(out_next_token + row, tl.where(first == _NONE, -1, first), mask=w_ok)
    tl.store(out_next_sibling + row, tl.where(sibling == _NONE, -1, sibling), mask=w_ok)
    tl.store(out_retrieve + row, row, mask=w_ok)
    tl.store(out_sizes + b, tl.sum(tl.where(is_valid, 1, 0), 0))


def pad_pool(pool: NodePool, prefix_lens: Tensor, width: int, out: Optional[PaddedTrees] = None) -> PaddedTrees:
    """:func:`sglang_echo.core.pack.pad_pool` as one program per request. ``out``: buffers to
    write into (contiguous, the shapes and dtypes this returns); every cell is written."""
    B, P, W, dev = pool.batch_size, pool.size, width, pool.tokens.device
    if any(
        getattr(pool, f).stride(1) != 1 or getattr(pool, f).stride(0) != pool.tokens.stride(0)
        for f in ("parent", "depth", "valid", "keep")
    ):
        raise ValueError("pad_pool: the pool's fields must share one row-major layout")
    if out is None:
        out = PaddedTrees(
            tokens=torch.empty(B, W, dtype=torch.int64, device=dev),
            parents=torch.empty(B, W, dtype=torch.int64, device=dev),
            depth=torch.empty(B, W, dtype=torch.int64, device=dev),
            positions=torch.empty(B, W, dtype=torch.int64, device=dev),
            mask=torch.empty(B, W, W, dtype=torch.bool, device=dev),
            valid=torch.empty(B, W, dtype=torch.bool, device=dev),
        )
    _pad_pool_kernel[(B,)](
        pool.tokens,
        pool.parent,
        pool.depth,
        pool.valid,
        pool.keep,
        pool.tokens.stride(0),
        P,
        prefix_lens.long().contiguous(),
        out.tokens,
        out.parents,
        out.depth,
        out.positions,
        out.mask,
        out.valid,
        W,
        BLOCK_P=block(P),
        BLOCK_W=block(W),
        num_warps=_warps(W),
    )
    return out


def dense_from_padded(
    padded: PaddedTrees, seq_lens: Tensor, out: Optional[DenseVerifyTensors] = None
) -> DenseVerifyTensors:
    """:func:`sglang_echo.core.dense.dense_from_padded` (QLEN_ONLY mask) as one program
    per request. ``out``: buffers to write into (as :func:`pad_pool`'s); ``out.valid`` is
    ``padded.valid`` either way."""
    B, W = padded.valid.shape
    dev = padded.valid.device
    if out is None:
        flat = lambda dtype: torch.empty(B * W, dtype=dtype, device=dev)  # noqa: E731
        tree_mask = torch.empty(B, W, W, dtype=torch.bool, device=dev)
        out = DenseVerifyTensors(
            draft_token=flat(torch.int64),
            positions=flat(torch.int64),
            custom_mask=tree_mask.view(-1),
            retrieve_index=flat(torch.int64).view(B, W),
            retrieve_next_token=flat(torch.int64).view(B, W),
            retrieve_next_sibling=flat(torch.int64).view(B, W),
            tree_mask=tree_mask,
            valid=padded.valid,
            sizes=torch.empty(B, dtype=torch.int32, device=dev),
        )
    tokens, parents, positions, mask, valid = (
        t.contiguous() for t in (padded.tokens, padded.parents, padded.positions, padded.mask, padded.valid)
    )
    _dense_kernel[(B,)](
        tokens,
        parents,
        positions,
        mask,
        valid,
        seq_lens.long().contiguous(),
        out.draft_token,
        out.positions,
        out.tree_mask,
        out.retrieve_next_token,
        out.retrieve_next_sibling,
        out.retrieve_index,
        out.sizes,
        W,
        BLOCK_W=block(W),
        num_warps=_warps(W),
    )
    out.valid = padded.valid
    return out


def _warps(width: int) -> int:
    return 1 if width <= 16 else 2 if width <= 32 else 4  # no register spills on sm_90 (tests/kernels)
