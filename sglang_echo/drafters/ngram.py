"""A parameter-free n-gram drafter: prompt lookup / suffix decoding over each request's own text.

The idea is prompt-lookup decoding (Saxena, 2023) and suffix decoding (Oliaro et al., 2024): the
text a model is about to write often repeats something already in its prompt or output (code,
quotes, extraction, boilerplate). For a tree node the *context* is the request's committed
history followed by the node's drafted path (the root is the last history token). The drafter
takes the longest suffix of the context, ``m`` tokens with ``max_ngram >= m >= min_ngram``, that
occurred earlier in the context, counts which tokens followed those earlier occurrences, and
proposes the ``k`` most frequent (ties: the most recent occurrence) as the node's children, so
several continuations become several branches. No earlier occurrence: the node gets no children.

Index. Per request, ``ngram -> {next token: [count, last position]}`` over the history, for every
n-gram length, extended incrementally by :meth:`catch_up` (O(max_ngram) per committed token). A
lookup reads that table for the occurrences followed by a history token and scans the at most
``max_ngram + depth`` context tokens around the drafted path for those followed by a path token.

Confidence model. ECHO's gates and path scores read the children's log-probabilities and rank
them against a head's, so they should be acceptance probabilities. A child ``x`` that followed
``c_x`` of the ``n`` earlier occurrences of a length-``m`` suffix gets::

    q(x) = c_x / (n + alpha) * r_m

``c_x / (n + alpha)`` is the empirical continuation frequency with ``alpha`` pseudo-counts of "none
of these" (a suffix seen once is not a certainty); ``r_m`` is how often a repetition of ``m``
tokens goes on as before: a shared word often does not, a shared four-token phrase almost always
does. ``q`` is in (0, 1), grows with ``c_x`` (and with ``m`` where ``r`` does), and siblings sum to at
most ``n / (n + alpha) < 1``. The defaults are SmolLM2-135M-Instruct's, fitted by maximum
likelihood on its own greedy answers to the training prompts (never the dev split);
``benchmarks/ngram_confidence.py`` measures them for another target and checks them on held-out
answers.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import Tensor

from sglang_echo.core.policy import Frontier
from sglang_echo.core.tree import Candidates

from .base import Drafter

Stats = dict[int, list[int]]  # next token -> [count, last position of that token]


# The confidence model's defaults (module docstring), fitted on SmolLM2-135M-Instruct's answers.
ALPHA = 0.15
RELIABILITY = (0.39, 0.68, 0.81, 1.0)  # r_m for m = 1, 2, 3, 4 (and longer)


class NGramDrafter(Drafter):
    name = "ngram"
    captured_layers: tuple[int, ...] = ()

    def __init__(
        self,
        max_ngram: int = 4,
        min_ngram: int = 1,
        alpha: float = ALPHA,
        reliability: Sequence[float] = RELIABILITY,
    ):
        """``reliability[m - 1]`` is ``r_m``; a longer match than it lists takes its last value."""
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if alpha <= 0:
            raise ValueError(f"alpha must be positive, got {alpha}")
        if not reliability or not all(0 < r <= 1 for r in reliability):
            raise ValueError(f"reliability must list r_m in (0, 1], got {tuple(reliability)}")
        self.max_ngram, self.min_ngram, self.alpha = max_ngram, min_ngram, alpha
        rel = tuple(float(r) for r in reliability)
        self.reliability = (rel + rel[-1:] * max_ngram)[:max_ngram]
        self.start([])

    def describe(self) -> str:
        """The parameters, as a calibration file records this drafter's identity."""
        rel = "/".join(f"{r:g}" for r in self.reliability)
        return f"n={self.min_ngram}..{self.max_ngram},alpha={self.alpha:g},r={rel}"

    # -- the lifecycle -----------------------------------------------------------------------
    def start(self, prompts: Sequence[Tensor]) -> None:
        self._hist: list[list[int]] = []
        self._index: list[dict[tuple[int, ...], Stats]] = []
        # Tokens the prefill catch-up repeats (prompt[1:], see base.py) and that we already hold.
        self._skip: list[int] = []
        self._paths: list[list[tuple[int, ...]]] = []  # drafted path of every last candidate column
        self._frontier_paths: list[list[tuple[int, ...]]] = []  # of each node the last propose expanded
        for b, prompt in enumerate(prompts):
            toks = [int(t) for t in prompt.reshape(-1).tolist()]
            if not toks:
                raise ValueError(f"request {b} has an empty prompt")
            self._hist.append([])
            self._index.append({})
            self._skip.append(len(toks) - 1)
            for t in toks:
                self._push(b, t)

    def catch_up(self, tokens: Sequence[Tensor], features: Optional[Sequence[Tensor]] = None) -> None:
        if len(tokens) != len(self._hist):
            raise ValueError(f"catch_up got {len(tokens)} requests, the batch has {len(self._hist)}")
        for b, t in enumerate(tokens):
            new = [int(x) for x in t.reshape(-1).tolist()]
            if not new:
                continue
            skip = self._skip[b]
            if skip:  # the prefill catch-up: prompt[1:] + [first token]
                if new[:skip] != self._hist[b][1 : skip + 1] or len(new) <= skip:
                    raise ValueError(f"request {b}: the first catch_up must be prompt[1:] + new tokens")
                new, self._skip[b] = new[skip:], 0
            for x in new:
                self._push(b, x)

    def propose(self, frontier: Frontier, k: int) -> Candidates:
        B, F = frontier.slots.shape
        C = F * k
        valid_in, source = frontier.valid.tolist(), frontier.source.tolist()
        tokens = [[0] * C for _ in range(B)]
        logprob = [[float("-inf")] * C for _ in range(B)]
        valid = [[False] * C for _ in range(B)]
        paths: list[list[tuple[int, ...]]] = [[()] * C for _ in range(B)]
        self._frontier_paths = [[()] * F for _ in range(B)]
        for b in range(B):
            for f in range(F):
                if not valid_in[b][f]:
                    continue
                path = self._frontier_paths[b][f] = self._paths[b][source[b][f]] if source[b][f] >= 0 else ()
                for i, (tok, p) in enumerate(self._continuations(b, path, k)):
                    col = f * k + i
                    tokens[b][col], logprob[b][col], valid[b][col] = tok, math.log(p), True
                    paths[b][col] = path + (tok,)
        self._paths = paths
        dev = frontier.slots.device
        parent = torch.arange(F, device=dev).repeat_interleave(k).expand(B, C)
        return Candidates(
            tokens=torch.tensor(tokens, dtype=torch.int64, device=dev).reshape(B, C),
            logprob=torch.tensor(logprob, dtype=torch.float32, device=dev).reshape(B, C),
            parent=parent.contiguous(),
            valid=torch.tensor(valid, dtype=torch.bool, device=dev).reshape(B, C),
        )

    def adopt(self, parent: Tensor, tokens: Tensor, *, before: bool) -> None:
        """A foreign child's drafted path is its parent's plus its token (:class:`.base.Drafter`)."""
        theirs = [
            [self._frontier_paths[b][f] + (tok,) for f, tok in zip(fs, toks)]
            for b, (fs, toks) in enumerate(zip(parent.tolist(), tokens.tolist()))
        ]
        self._paths = [t + m if before else m + t for t, m in zip(theirs, self._paths)]

    # -- internals ---------------------------------------------------------------------------
    def history(self, b: int) -> list[int]:
        """Request ``b``'s committed tokens (a copy)."""
        return list(self._hist[b])

    def _push(self, b: int, tok: int) -> None:
        """Append one committed token: every n-gram ending just before it gains ``tok`` as next."""
        hist, index = self._hist[b], self._index[b]
        t = len(hist)
        for n in range(self.min_ngram, min(self.max_ngram, t) + 1):
            entry = index.setdefault(tuple(hist[t - n : t]), {}).setdefault(tok, [0, t])
            entry[0] += 1
            entry[1] = t
        hist.append(tok)

    def _continuations(self, b: int, path: tuple[int, ...], k: int) -> list[tuple[int, float]]:
        """Up to ``k`` (token, probability) children of the node whose drafted path is ``path``."""
        found = self.match(b, path)
        if found is None:
            return []
        m, counts = found
        scale = self.reliability[m - 1] / (sum(c for _, c in counts) + self.alpha)
        return [(tok, c * scale) for tok, c in counts[:k]]

    def match(self, b: int, path: tuple[int, ...] = ()) -> Optional[tuple[int, list[tuple[int, int]]]]:
        """The longest suffix of request ``b``'s context (history + ``path``) seen before: its length
        ``m`` and ``(next token, count)`` of every continuation, most frequent first (ties: the
        most recent); None when no suffix of ``min_ngram`` tokens or more repeats."""
        hist = self._hist[b]
        h = min(len(hist), self.max_ngram)
        tail = hist[len(hist) - h :] + list(path)  # the context's last h + len(path) tokens
        offset = len(hist) - h  # position of tail[0] in the context
        for m in range(min(self.max_ngram, len(hist) + len(path) - 1), self.min_ngram - 1, -1):
            query = tuple(tail[-m:])
            stats = {tok: (c, last) for tok, (c, last) in self._index[b].get(query, {}).items()}
            for j in range(max(h, m), len(tail)):  # earlier occurrences followed by a path token
                if tuple(tail[j - m : j]) == query:
                    c, _ = stats.get(tail[j], (0, -1))
                    stats[tail[j]] = (c + 1, offset + j)  # path positions are the most recent
            if stats:
                ranked = sorted(stats.items(), key=lambda kv: (-kv[1][0], -kv[1][1]))
                return m, [(tok, c) for tok, (c, _) in ranked]
        return None
