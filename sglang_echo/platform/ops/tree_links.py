"""Recover parent / sibling order from sglang's linked-list tree encoding (vectorised)."""

from __future__ import annotations

import math

import torch


def chain_parent_and_rank(next_token: torch.Tensor, next_sibling: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per node: its parent (-1 for the root / unreachable) and its rank in its sibling list.

    sglang encodes a draft tree per request as `retrive_next_token[p]` = first child of p and
    `retrive_next_sibling[c]` = next sibling of c (-1 terminated). Pointer doubling along the
    reversed sibling links gives each node the head of its list and its distance from it in
    O(log n) vectorised steps instead of a Python walk over nodes.
    """
    bs, n = next_token.shape
    dev = next_token.device
    nt = next_token.to(torch.int64)
    ns = next_sibling.to(torch.int64)
    batch = torch.arange(bs, device=dev)[:, None].expand(bs, n)
    nodes = torch.arange(n, device=dev)[None, :].expand(bs, n)

    # prev[c] = the sibling pointing at c (or c itself when c heads its list).
    prev = nodes.clone()
    has_next = ns >= 0
    prev[batch[has_next], ns[has_next]] = nodes[has_next]
    rank = (prev != nodes).to(torch.int64)
    head = prev.clone()
    for _ in range(max(1, math.ceil(math.log2(max(n, 2))))):
        rank = rank + torch.where(head != nodes, rank.gather(1, head), 0)
        head = head.gather(1, head)

    # The head of each list is the first child of its parent.
    head_parent = torch.full((bs, n), -1, dtype=torch.int64, device=dev)
    has_child = nt >= 0
    head_parent[batch[has_child], nt[has_child]] = nodes[has_child]
    parent = head_parent.gather(1, head)
    return parent, rank
