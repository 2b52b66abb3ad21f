"""Draft-tree construction ops (sgl_kernel CPU signatures, pure torch)."""

from __future__ import annotations

import torch

FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2


def _draft_parents(
    parent_list: torch.Tensor, selected_index: torch.Tensor, topk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """parent[b, i] (node numbering, 0 = root) and whether the kernel may keep climbing.

    Node i >= 1 is `selected_index[b, i - 1]`. Its parent is the root when
    `selected_index // topk == 0`, else the node whose selected index equals
    `parent_list[b, selected_index // topk]` (first match); no match = a dangling node.
    """
    bs, m = selected_index.shape  # m = draft_token_num - 1
    sel = selected_index.to(torch.int64)
    ptb = sel // topk
    pl = parent_list.reshape(bs, -1).to(torch.int64)
    ptoken = pl.gather(1, ptb.clamp(max=pl.shape[1] - 1))
    eq = sel[:, None, :] == ptoken[:, :, None]  # [b, child, candidate]
    found = eq.any(-1)
    pos = eq.to(torch.int8).argmax(-1) + 1
    at_root = ptb == 0
    parent = torch.where(at_root, 0, torch.where(found, pos, -1))
    climbs = ~at_root & found
    pad = torch.zeros(bs, 1, dtype=torch.int64, device=sel.device)
    return torch.cat([pad - 1, parent], 1), torch.cat([pad.bool(), climbs], 1)


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Build the EAGLE verify tree: ancestor mask, positions and retrieve_* links.

    Mirrors `sgl_build_tree_kernel_efficient_triton` (sglang/kernels/ops/speculative/
    spec_tree.py). Loops run over tree depth only; requests and nodes are vectorised.
    """
    mode = int(tree_mask_mode)
    if mode == QLEN_ONLY_BITPACKING:
        raise NotImplementedError("QLEN_ONLY_BITPACKING tree masks are not supported on CPU")
    bs, n = verified_seq_len.numel(), draft_token_num
    dev = verified_seq_len.device
    seq = verified_seq_len.to(torch.int64)
    parent, climbs = _draft_parents(parent_list, selected_index, topk)
    nodes = torch.arange(n, device=dev)
    batch = torch.arange(bs, device=dev)[:, None].expand(bs, n)

    # Links: first child = smallest child index; next sibling = next larger index, same parent.
    same = (parent[:, :, None] == parent[:, None, :]) & (nodes[None, :, None] < nodes[None, None, :])
    sib = torch.where(same, nodes, n).min(-1).values  # [b, i]
    has_sib = (sib < n) & (parent >= 0)
    rs = retrieve_next_sibling.view(bs, n)
    rs.copy_(torch.where(has_sib, sib, rs.to(torch.int64)).to(rs.dtype))
    is_child = parent[:, :, None] == nodes[None, None, :]  # [b, child, p]
    first = torch.where(is_child, nodes[None, :, None], n).min(1).values  # [b, p]
    rt = retrieve_next_token.view(bs, n)
    rt.copy_(torch.where(first < n, first, rt.to(torch.int64)).to(rt.dtype))
    retrieve_index.view(bs, n).copy_((batch * n + nodes).to(retrieve_index.dtype))

    # Ancestor mask + depth: climb at most `depth` steps from every node at once.
    anc = torch.zeros(bs, n, n, dtype=torch.bool, device=dev)
    anc[:, :, 0] = True
    cur = nodes[None, :].expand(bs, n).clone()
    alive = nodes[None, :].expand(bs, n) > 0
    steps = torch.zeros(bs, n, dtype=torch.int64, device=dev)
    for _ in range(depth):
        anc[batch[alive], nodes[None, :].expand(bs, n)[alive], cur[alive]] = True
        steps += alive.to(torch.int64)
        go = alive & climbs.gather(1, cur)
        cur = torch.where(go, parent.gather(1, cur.clamp_min(0)), cur)
        alive = go
    positions.view(bs, n).copy_((seq[:, None] + steps).to(positions.dtype))

    if mode == QLEN_ONLY:
        tree_mask[: bs * n * n].copy_(anc.reshape(-1).to(tree_mask.dtype))
        return
    # FULL_MASK: request b's rows are (seq_len_b + n) wide, packed one request after another;
    # only the n tree columns of each row are written (the prefix columns are the caller's).
    row_start = n * n * torch.arange(bs, device=dev) + n * (torch.cumsum(seq, 0) - seq)
    offs = row_start[:, None, None] + (seq[:, None, None] + n) * nodes[None, :, None] + seq[:, None, None] + nodes
    tree_mask[offs.reshape(-1)] = anc.reshape(-1).to(tree_mask.dtype)


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """NGRAM verify metadata from an (n x n per request) ancestor mask.

    Mirrors `_reconstruct_tree_mask_kernel` (sglang/kernels/ops/speculative/reconstruct_tree.py),
    whose docstring states the contract this function implements term by term.
    """
    bs, n = batch_size, draft_token_num
    if bs == 0:
        return
    dev = tree_mask.device
    idx = torch.arange(n, device=dev)
    m = tree_mask.reshape(-1)[: bs * n * n].view(bs, n, n).to(torch.bool)
    anc = m & (idx[None, None, :] < idx[None, :, None])  # [b, i, j]: j strict ancestor of i
    depth = anc.sum(-1)
    positions.view(-1)[: bs * n] = (depth + verified_seq_len.to(torch.int64)[:, None]).reshape(-1).to(positions.dtype)
    parent = torch.where(anc, idx, -1).max(-1).values
    first_child = torch.where(anc, idx[None, :, None], n).min(1).values  # over rows i
    next_token = torch.where(first_child < n, first_child, -1)
    same = (parent[:, :, None] == parent[:, None, :]) & (idx[None, :, None] > idx[None, None, :])
    first_sib = torch.where(same, idx[None, :, None], n).min(1).values  # [b, tid]
    next_sib = torch.where((parent >= 0) & (first_sib < n), first_sib, -1)
    b_idx = torch.arange(bs, device=dev)[:, None]
    retrieve_index.view(-1)[: bs * n] = (b_idx * n + idx).reshape(-1).to(retrieve_index.dtype)
    retrieve_next_token.view(-1)[: bs * n] = next_token.reshape(-1).to(retrieve_next_token.dtype)
    retrieve_next_sibling.view(-1)[: bs * n] = next_sib.reshape(-1).to(retrieve_next_sibling.dtype)
