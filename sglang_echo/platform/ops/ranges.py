"""Ragged-range helper shared by the KV-cache ops."""

from __future__ import annotations

import torch


def ragged_ranges(starts: torch.Tensor, ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten per-row ranges [starts[i], ends[i]) into (row_id, column) pairs, row-major.

    This is the vectorised form of the per-program `for offset in range(start, end)` loops in
    sglang's Triton kernels: one `repeat_interleave` instead of a Python loop over tokens. On the
    host, ranges of one length (every decode and plain verify step: one token per request) skip it:
    these ops run a few times per step, and that path costs about half as much there. (On a GPU the
    check would be a device sync.)
    """
    starts = starts.to(torch.int64)
    lens = (ends.to(torch.int64) - starts).clamp_min(0)
    dev = lens.device
    if dev.type == "cpu" and lens.numel() and bool((lens == lens[0]).all()):
        n, width = lens.numel(), int(lens[0])
        rows = torch.arange(n, device=dev)[:, None].expand(n, width)
        cols = starts[:, None] + torch.arange(width, device=dev)
        return rows.reshape(-1), cols.reshape(-1)
    rows = torch.repeat_interleave(torch.arange(lens.numel(), device=dev), lens)
    # Column = start of its row + rank inside the row.
    first = torch.cumsum(lens, 0) - lens
    cols = torch.arange(rows.numel(), device=dev) - first[rows] + starts[rows]
    return rows, cols
