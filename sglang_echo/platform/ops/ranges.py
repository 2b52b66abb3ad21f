"""Ragged-range helper shared by the KV-cache ops."""

from __future__ import annotations

import torch


def ragged_ranges(starts: torch.Tensor, ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten per-row ranges [starts[i], ends[i]) into (row_id, column) pairs, row-major.

    This is the vectorised form of the per-program `for offset in range(start, end)` loops in
    sglang's Triton kernels: one `repeat_interleave` instead of a Python loop over tokens.
    """
    starts = starts.to(torch.int64)
    lens = (ends.to(torch.int64) - starts).clamp_min(0)
    rows = torch.repeat_interleave(torch.arange(lens.numel(), device=lens.device), lens)
    # Column = start of its row + rank inside the row.
    first = torch.cumsum(lens, 0) - lens
    cols = torch.arange(rows.numel(), device=lens.device) - first[rows] + starts[rows]
    return rows, cols
