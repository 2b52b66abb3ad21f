"""Training batches: padded sequences of similar length, in a seeded order per epoch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .features import Sequence


@dataclass
class Batch:
    tokens: Tensor  # [B, T] int64, 0-padded
    features: Tensor  # [B, T, n * H]
    lengths: Tensor  # [B]
    prompt_lengths: Tensor  # [B]

    def to(self, device) -> "Batch":
        return Batch(
            *(t.to(device, non_blocking=True) for t in (self.tokens, self.features, self.lengths, self.prompt_lengths))
        )

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())


def collate(seqs: list[Sequence]) -> Batch:
    T = max(len(s.tokens) for s in seqs)
    tokens = torch.zeros(len(seqs), T, dtype=torch.long)
    feats = torch.zeros(len(seqs), T, seqs[0].features.shape[-1], dtype=seqs[0].features.dtype)
    for i, s in enumerate(seqs):
        tokens[i, : len(s.tokens)], feats[i, : len(s.tokens)] = s.tokens, s.features
    return Batch(tokens, feats, torch.tensor([len(s.tokens) for s in seqs]), torch.tensor([s.prompt_len for s in seqs]))


def make_batches(seqs: list[Sequence], batch_tokens: int, seed: int) -> list[list[int]]:
    """Index batches of similar-length sequences (less padding) in a seeded random order."""
    g = torch.Generator().manual_seed(seed)
    order = sorted(torch.randperm(len(seqs), generator=g).tolist(), key=lambda i: len(seqs[i].tokens))
    batches, cur, longest = [], [], 0
    for i in order:
        longest_next = max(longest, len(seqs[i].tokens))
        if cur and longest_next * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, longest_next = [], len(seqs[i].tokens)
        cur.append(i)
        longest = longest_next
    if cur:
        batches.append(cur)
    perm = torch.randperm(len(batches), generator=g).tolist()
    return [batches[p] for p in perm]
