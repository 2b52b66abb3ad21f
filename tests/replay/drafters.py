"""A deterministic test drafter whose proposals depend only on (committed history, drafted path).

That purity is what makes a drafter replayable (any drafter in the repo has it up to rounding);
this one also knows the greedy reference, so it proposes the true next token often and its trees
get long accepted paths, which exercises budgets, gates and the oracle.
"""

from __future__ import annotations

import math
import random
from typing import Optional, Sequence

import torch
from torch import Tensor

from sglang_echo.core.policy import Frontier
from sglang_echo.core.tree import Candidates
from sglang_echo.drafters.base import Drafter

MAXK = 12  # children the drafter knows per node (asked for more, it returns these)


class HashDrafter(Drafter):
    name = "hash"
    captured_layers: tuple[int, ...] = ()

    def __init__(self, refs: dict[tuple[int, ...], list[int]], vocab: int, p_good: float = 0.75):
        self.refs, self.vocab, self.p_good = refs, vocab, p_good
        self.start([])

    def start(self, prompts: Sequence[Tensor]) -> None:
        self.prompt = [tuple(p.reshape(-1).tolist()) for p in prompts]
        self.hist = [list(p) for p in self.prompt]
        self.fresh = [True] * len(prompts)
        self.paths: list[list[tuple[int, ...]]] = [[] for _ in prompts]

    def catch_up(self, tokens: Sequence[Tensor], features: Optional[Sequence[Tensor]] = None) -> None:
        for b, t in enumerate(tokens):
            new = t.reshape(-1).tolist()
            if self.fresh[b] and new:  # prompt[1:] + [first]
                new, self.fresh[b] = new[len(self.prompt[b]) - 1 :], False
            self.hist[b].extend(new)

    def children(self, b: int, path: tuple[int, ...], k: int) -> list[tuple[int, float]]:
        ctx = tuple(self.hist[b]) + path
        rng = random.Random(hash(ctx))
        ref = self.refs.get(self.prompt[b], [])
        n_out = len(self.hist[b]) - len(self.prompt[b]) + len(path)  # generated tokens in ctx
        on_track = list(ctx[len(self.prompt[b]) :]) == ref[:n_out] and n_out < len(ref)
        # A fixed, best-first list whatever k is: asking for fewer children gives a prefix, as
        # top-k drafters do.
        probs = sorted((rng.random() for _ in range(MAXK)), reverse=True)
        total = sum(probs) / rng.uniform(0.5, 0.99)
        toks = [rng.randrange(self.vocab) for _ in range(MAXK)]
        if on_track and rng.random() < self.p_good:
            toks[rng.randrange(2)] = ref[n_out]  # the true token, usually first or second
        out, seen = [], set()
        for tok, p in zip(toks, probs):
            if tok not in seen:
                seen.add(tok)
                out.append((tok, math.log(p / total)))
        return out[: rng.randrange(1, MAXK + 1)][:k]  # sometimes fewer than k

    def propose(self, frontier: Frontier, k: int) -> Candidates:
        B, F = frontier.slots.shape
        C = F * k
        valid_in, source = frontier.valid.tolist(), frontier.source.tolist()
        tokens, logprob = [[0] * C for _ in range(B)], [[float("-inf")] * C for _ in range(B)]
        valid, paths = [[False] * C for _ in range(B)], [[()] * C for _ in range(B)]
        for b in range(B):
            for f in range(F):
                if not valid_in[b][f]:
                    continue
                path = self.paths[b][source[b][f]] if source[b][f] >= 0 else ()
                for i, (tok, lp) in enumerate(self.children(b, path, k)):
                    col = f * k + i
                    tokens[b][col], logprob[b][col], valid[b][col], paths[b][col] = tok, lp, True, path + (tok,)
        self.paths = paths
        return Candidates(
            tokens=torch.tensor(tokens, dtype=torch.int64).reshape(B, C),
            logprob=torch.tensor(logprob, dtype=torch.float32).reshape(B, C),
            parent=torch.arange(F).repeat_interleave(k).expand(B, C).contiguous(),
            valid=torch.tensor(valid, dtype=torch.bool).reshape(B, C),
        )
