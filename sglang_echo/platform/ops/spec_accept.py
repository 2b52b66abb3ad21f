"""Speculative-decoding acceptance ops (sgl_kernel CPU signatures, pure torch)."""

from __future__ import annotations

import torch

from sglang_echo.platform.ops.tree_links import chain_parent_and_rank


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """bonus_tokens[b] = accept_tokens.flat[b * stride + accept_lens[b] - 1].

    Mirrors `fill_bonus_tokens` (sglang/kernels/ops/speculative/eagle.py).
    """
    bs = accept_lens.numel()
    idx = torch.arange(bs, device=accept_lens.device) * accept_stride + accept_lens.to(torch.int64) - 1
    bonus_tokens[:bs] = accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype)


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
) -> None:
    """Compact out_cache_loc[accept_index] over the entries != -1, keeping their order.

    Mirrors `fill_accept_out_cache_loc` (sglang/kernels/ops/speculative/eagle.py): the
    destination of entry i is the number of valid entries before it.
    """
    flat = accept_index.reshape(-1)
    src = flat[flat != -1].to(torch.int64)
    accept_out_cache_loc[: src.numel()] = out_cache_loc[src].to(accept_out_cache_loc.dtype)


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree verification: walk down the draft tree while a child equals the target.

    Mirrors `verify_tree_greedy_kernel_triton` (sglang/kernels/ops/speculative/spec_tree.py).
    At each level the accepted child is the FIRST child in sibling-list order whose candidate
    equals the target's prediction at the current node. The loop runs over tree levels
    (num_speculative_tokens, a small constant); requests and nodes are vectorised.
    """
    bs, n = candidates.shape
    num_spec = accept_index.shape[1]
    dev = candidates.device
    target_flat = target_predict.reshape(-1)
    ridx = retrive_index.to(torch.int64)
    if num_spec == 1:  # a plain step (depth 0): only the roots, no tree to walk
        roots = ridx[:, 0]
        accept_index[:, 0] = roots.to(accept_index.dtype)
        accept_token_num[:bs] = 0
        predicts.reshape(-1)[roots] = target_flat[roots].to(predicts.dtype)
        return
    parent, rank = chain_parent_and_rank(retrive_next_token, retrive_next_sibling)
    batch = torch.arange(bs, device=dev)

    cur = torch.zeros(bs, dtype=torch.int64, device=dev)  # local node id of last accepted
    last = ridx[:, 0].clone()  # its global (flat) index
    active = torch.ones(bs, dtype=torch.bool, device=dev)
    num_acc = torch.zeros(bs, dtype=torch.int64, device=dev)
    accept_index[:, 0] = last.to(accept_index.dtype)
    accepted_globals = [last.clone()]
    accepted_masks = [torch.ones(bs, dtype=torch.bool, device=dev)]
    big = n + 1
    for _level in range(1, num_spec):
        target = target_flat[last]
        ok = (parent == cur[:, None]) & (candidates == target[:, None]) & active[:, None]
        best_rank, child = torch.where(ok, rank, big).min(dim=1)
        matched = best_rank < big
        num_acc += matched.to(torch.int64)
        new_last = ridx[batch, child]
        sel = batch[matched]
        accept_index[sel, num_acc[sel]] = new_last[sel].to(accept_index.dtype)
        last = torch.where(matched, new_last, last)
        cur = torch.where(matched, child, cur)
        accepted_globals.append(new_last)
        accepted_masks.append(matched)
        active &= matched
    accept_token_num[:bs] = num_acc.to(accept_token_num.dtype)
    # predicts[node] = target_predict[node] for every accepted node (root included), which is
    # what the kernel's per-match store plus its final store amount to.
    g = torch.stack(accepted_globals, 1)[torch.stack(accepted_masks, 1)]
    predicts.reshape(-1)[g] = target_flat[g].to(predicts.dtype)
