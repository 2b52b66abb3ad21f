"""A scripted test drafter: proposes the reference (AR greedy) continuation for "oracle" requests
and random tokens for the others, and checks the catch-up contract as it goes."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import Tensor

from sglang_echo.core.policy import Frontier
from sglang_echo.core.tree import Candidates
from sglang_echo.drafters.base import Drafter


class ScriptedDrafter(Drafter):
    name = "scripted"

    def __init__(
        self,
        refs: Sequence[Sequence[int]],
        oracle: Sequence[bool],
        vocab: int,
        captured_layers: tuple[int, ...] = (),
        feature_dim: int = 0,
        p_right: float = 0.9,
        seed: int = 0,
    ):
        self.refs, self.oracle, self.vocab = [list(r) for r in refs], list(oracle), vocab
        self.captured_layers, self.feature_dim, self.p_right = tuple(captured_layers), feature_dim, p_right
        self.gen = torch.Generator().manual_seed(seed)

    def start(self, prompts: Sequence[Tensor]) -> None:
        self.hist = [p.reshape(-1).tolist()[:1] for p in prompts]
        self.plen = [p.numel() for p in prompts]
        self.features: list[list[Tensor]] = [[] for _ in prompts]
        self.paths: list[list[tuple[int, ...]]] = [[] for _ in prompts]
        self.started = False

    def catch_up(self, tokens: Sequence[Tensor], features: Optional[Sequence[Tensor]]) -> None:
        assert len(tokens) == len(self.hist)
        if self.captured_layers:
            assert features is not None and len(features) == len(tokens)
        else:
            assert features is None
        for b, t in enumerate(tokens):
            new = t.reshape(-1).tolist()
            if not self.started:  # prompt[1:] + [first]
                assert len(new) == self.plen[b]
            if features is not None:
                assert features[b].shape == (len(new), self.feature_dim), (features[b].shape, len(new))
                self.features[b].append(features[b].detach().cpu())
            self.hist[b].extend(new)
        self.started = True

    def _random(self, n: int) -> list[int]:
        return torch.randint(0, self.vocab, (n,), generator=self.gen).tolist()

    def propose(self, frontier: Frontier, k: int) -> Candidates:
        B, F = frontier.slots.shape
        C = F * k
        valid_in, source = frontier.valid.tolist(), frontier.source.tolist()
        tokens = [[0] * C for _ in range(B)]
        logprob = [[float("-inf")] * C for _ in range(B)]
        valid = [[False] * C for _ in range(B)]
        paths = [[()] * C for _ in range(B)]
        for b in range(B):
            n_out = len(self.hist[b]) - self.plen[b]  # generated tokens committed so far
            ref = self.refs[b]
            for f in range(F):
                if not valid_in[b][f]:
                    continue
                path = self.paths[b][source[b][f]] if source[b][f] >= 0 else ()
                pos = n_out + len(path)
                on_track = self.oracle[b] and pos < len(ref) and list(path) == ref[n_out:pos]
                if on_track:
                    toks = [ref[pos]] + self._random(k - 1)
                    lps = [math.log(self.p_right)] + [math.log((1 - self.p_right) / max(k - 1, 1))] * (k - 1)
                else:
                    toks = self._random(k)
                    lps = [math.log(0.6)] + [math.log(0.4 / max(k - 1, 1))] * (k - 1)
                for i in range(k):
                    col = f * k + i
                    tokens[b][col], logprob[b][col], valid[b][col] = toks[i], lps[i], True
                    paths[b][col] = path + (toks[i],)
        self.paths = paths
        dev = frontier.slots.device
        return Candidates(
            tokens=torch.tensor(tokens, dtype=torch.int64, device=dev),
            logprob=torch.tensor(logprob, dtype=torch.float32, device=dev),
            parent=torch.arange(F, device=dev).repeat_interleave(k).expand(B, C).contiguous(),
            valid=torch.tensor(valid, dtype=torch.bool, device=dev),
        )
