"""Padded-dense verify layout: our CSR draft trees -> the tensors of sglang's EagleVerifyInput.

Every request gets exactly ``W`` slots (``W = --speculative-num-draft-tokens``); request ``b``
uses slots ``[0, K_b)`` for its real tree (root first, topologically ordered) and the rest are
*padding nodes*:

* token = the root token (in-vocab), position = ``seq_len_b`` (depth 0);
* mask row = the diagonal only (never an all-false row), and no real node sees the padding;
* ``retrieve_index[b, j] = b*W + j`` (global flat id, as sglang indexes ``predict``/logits);
* ``retrieve_next_token = retrieve_next_sibling = -1`` and no real node links to it, so sglang's
  acceptance (greedy or target-only sampling) never reaches it.

Pure torch, no sglang import: unit-testable without a server.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .pack import PaddedTrees, child_links, pad_trees
from .tree import DraftTrees

# The attribute of a verify input (sglang's spec_info) that asks the target for ragged verify:
# [bs] int32 K_i, each request's real tree nodes (slots [0, K_i) of its W). The ECHO workers set it
# (integration/ragged.py); the attention backends that verify ragged trees read it (echo_torch on the
# CPU platform, echo_tree_triton).
RAGGED_MARK = "echo_verify_lens"


@dataclass
class DenseVerifyTensors:
    draft_token: Tensor  # [B*W] int64
    positions: Tensor  # [B*W] int64
    custom_mask: Tensor  # bool, QLEN_ONLY [B*W*W] or FULL_MASK [sum_b W*(L_b+W)]
    retrieve_index: Tensor  # [B, W] int64, b*W + j
    retrieve_next_token: Tensor  # [B, W] int64 local first child, -1
    retrieve_next_sibling: Tensor  # [B, W] int64 local next sibling, -1
    tree_mask: Tensor  # [B, W, W] bool ancestor-or-self (padding: diagonal only)
    valid: Tensor  # [B, W] bool real nodes
    sizes: Tensor  # [B] int32 K_b (root included)


def step_width(sizes: Tensor, width: int, per_step: bool) -> int:
    """The width to lay a step out in: ``width`` (W), or with ``per_step`` its widest tree
    (``W_s = max K_i``, at least 1), which is all a step's verify, acceptance and draft extend need."""
    return max(1, int(sizes.max())) if per_step and sizes.numel() else width


def to_sglang_dense(trees: DraftTrees, seq_lens: Tensor, width: int, full_mask: bool = False) -> DenseVerifyTensors:
    """Pack ``trees`` into sglang's dense verify layout of width ``width`` (see module doc)."""
    seq_lens = seq_lens.to(trees.tokens.device).long()
    return dense_from_padded(pad_trees(trees, seq_lens, width), seq_lens, full_mask)  # refuses a tree wider than W


def dense_from_padded(padded: PaddedTrees, seq_lens: Tensor, full_mask: bool = False) -> DenseVerifyTensors:
    """sglang's dense layout of trees already padded to ``W`` (:func:`pad_trees`, or
    :func:`~sglang_echo.core.pack.pad_pool` before compaction). Sync-free unless ``full_mask``."""
    valid = padded.valid
    B, W = valid.shape
    dev = valid.device
    seq_lens = seq_lens.long()
    roots = padded.tokens[:, :1].expand(B, W)  # slot 0 is every request's root
    tokens = torch.where(valid, padded.tokens, roots)
    positions = torch.where(valid, padded.positions, seq_lens[:, None].expand(B, W))
    eye = torch.eye(W, dtype=torch.bool, device=dev)[None]
    mask = padded.mask | (eye & ~valid[:, :, None])  # padding rows: diagonal only
    next_token, next_sibling = child_links(padded.parents, valid)
    retrieve_index = torch.arange(B * W, device=dev, dtype=torch.int64).view(B, W)
    custom_mask = full_prefix_rows(mask, seq_lens) if full_mask else mask.flatten()
    return DenseVerifyTensors(
        draft_token=tokens.flatten(),
        positions=positions.flatten(),
        custom_mask=custom_mask,
        retrieve_index=retrieve_index,
        retrieve_next_token=next_token,
        retrieve_next_sibling=next_sibling,
        tree_mask=mask,
        valid=valid,
        sizes=valid.sum(1).to(torch.int32),
    )


def plain_dense(roots: Tensor, seq_lens: Tensor, full_mask: bool = False) -> DenseVerifyTensors:
    """The width-1 layout of a step whose every tree is its root alone: what :func:`to_sglang_dense`
    packs for such trees, built directly (a plain step should cost about a plain decode step)."""
    B, dev = roots.numel(), roots.device
    seq_lens = seq_lens.to(dev).long()
    visible = torch.ones(B, 1, 1, dtype=torch.bool, device=dev)
    no_link = torch.full((B, 1), -1, dtype=torch.int64, device=dev)
    return DenseVerifyTensors(
        draft_token=roots.long(),
        positions=seq_lens.clone(),
        custom_mask=full_prefix_rows(visible, seq_lens) if full_mask else visible.flatten(),
        retrieve_index=torch.arange(B, device=dev, dtype=torch.int64).view(B, 1),
        retrieve_next_token=no_link,
        retrieve_next_sibling=no_link.clone(),
        tree_mask=visible,
        valid=visible[:, :, 0],
        sizes=torch.ones(B, dtype=torch.int32, device=dev),
    )


def full_mask_cells(prefix_lens: Tensor, num_draft: int, width: int | None = None) -> Tensor:
    """Where tree cell ``(b, j, k)`` sits in sglang's FULL_MASK ``custom_mask``, ``[B, n, width]``.

    FULL_MASK packs requests one after another, each as ``n`` rows of ``prefix_b + n`` cells;
    the tree columns of a row start after its ``prefix_b`` prefix columns.
    """
    n = num_draft
    width = n if width is None else width
    prefix = prefix_lens.to(torch.int64)
    row_len = prefix + n
    starts = torch.cumsum(row_len * n, 0) - row_len * n
    rows = torch.arange(n, device=prefix.device)
    cols = torch.arange(width, device=prefix.device)
    return (
        starts[:, None, None]
        + rows[None, :, None] * row_len[:, None, None]
        + prefix[:, None, None]
        + cols[None, None, :]
    )


def full_prefix_rows(mask: Tensor, seq_lens: Tensor) -> Tensor:
    """FULL_MASK layout: request ``b``'s ``W`` rows, each ``[L_b ones | mask[b, j]]``, concatenated.

    Built as one all-ones buffer with the tree blocks scattered in (no per-request loop); the
    total length is the one host read.
    """
    B, W, _ = mask.shape
    total = int((W * (seq_lens + W)).sum()) if B else 0
    out = torch.ones(total, dtype=torch.bool, device=mask.device)
    out[full_mask_cells(seq_lens, W).flatten()] = mask.flatten()
    return out
