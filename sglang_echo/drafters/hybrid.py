"""A head drafter and the n-gram drafter drafting one tree together: :class:`HybridDrafter`.

A head (EAGLE-3, DART, DFlash) guesses from the target's features; the n-gram drafter
(:mod:`.ngram`) copies what followed the same words earlier in the request. They win on
different text: copying wins where the answer repeats its context (retrieval, summaries,
translations, multi-turn edits, code), the head on new text. Drafting both into one tree lets
ECHO's scheduler spend the step's budget on whichever is confident at each node.

Each :meth:`~HybridDrafter.propose` asks both drafters for the same frontier and returns the
head's candidates followed by the n-gram's (``Candidates.drafter``: 0 head, 1 n-gram):

* **One node per token.** An n-gram child whose token the head also proposed under the same
  parent is dropped and the head's copy keeps the larger of the two probabilities, so no budget
  goes to a duplicate and agreement raises the node's path score.
* **Either drafter expands either's nodes.** After a depth each drafter :meth:`~.base.Drafter.adopt`
  the other's columns, so the next frontier's ``source`` names a column of the merged proposal in
  both: the head expands an n-gram node from its parent's state (EAGLE-3: the parent's hidden
  output; DART: the n-gram context the node ends; DFlash: the depth's marginal), the n-gram
  drafter looks its path up.

Losslessness is the verifier's, as for any drafter: the target checks every drafted token.
Temperature 0 only (both drafters propose deterministically).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from sglang_echo.core.policy import Frontier
from sglang_echo.core.tree import Candidates

from .base import Drafter
from .ngram import NGramDrafter

HEAD, NGRAM = 0, 1  # Candidates.drafter of each drafter's columns


class HybridDrafter(Drafter):
    """``head`` and ``ngram`` (default: a fresh :class:`.ngram.NGramDrafter`) drafting together.

    :meth:`propose` needs only their ``propose`` and ``adopt``, so the server composes its own
    step drafters the same way (:mod:`sglang_echo.integration.hybrid`); :meth:`start` and
    :meth:`catch_up` serve the offline loop."""

    def __init__(self, head: Drafter, ngram: Drafter | None = None):
        self.head = head
        self.ngram = NGramDrafter() if ngram is None else ngram
        self.name = f"{getattr(head, 'name', 'head')}+ngram"
        self.captured_layers = getattr(head, "captured_layers", ())

    @property
    def forwards(self) -> int:
        """The head's draft forwards (the n-gram lookups run none)."""
        return getattr(self.head, "forwards", 0)

    def describe(self) -> str:
        describe = getattr(self.head, "describe", None)
        return f"{describe() if describe else self.head.name};ngram:{self.ngram.describe()}"

    def start(self, prompts: Sequence[Tensor]) -> None:
        self.head.start(prompts)
        self.ngram.start(prompts)

    def catch_up(self, tokens: Sequence[Tensor], features: Sequence[Tensor] | None) -> None:
        self.head.catch_up(tokens, features)
        self.ngram.catch_up(tokens, None)

    def propose(self, frontier: Frontier, k: int) -> Candidates:
        h = self.head.propose(frontier, k)
        n = self.ngram.propose(frontier, k)
        if h.proposal is not None or n.proposal is not None:
            raise NotImplementedError("hybrid drafting is for temperature 0 (deterministic proposals)")
        dev = h.tokens.device
        n_parent, n_tokens = n.parent.to(dev), n.tokens.to(dev)
        # same[b, i, j]: head column i and n-gram column j are one node (same parent, same token).
        same = (
            (h.parent[:, :, None] == n_parent[:, None, :])
            & (h.tokens[:, :, None] == n_tokens[:, None, :])
            & h.valid[:, :, None]
            & n.valid.to(dev)[:, None, :]
        )
        n_lp = n.logprob.to(h.logprob)
        agreed = torch.where(same, n_lp[:, None, :], float("-inf")).amax(2)  # [B, Ch]
        logprob = torch.cat([torch.maximum(h.logprob, agreed), n_lp], 1)
        valid = torch.cat([h.valid, n.valid.to(dev) & ~same.any(1)], 1)
        self.head.adopt(n_parent, n_tokens, before=False)
        self.ngram.adopt(h.parent, h.tokens, before=True)
        drafter = torch.cat([torch.full_like(h.tokens, HEAD), torch.full_like(n_tokens, NGRAM)], 1)
        return Candidates(
            tokens=torch.cat([h.tokens, n_tokens], 1),
            logprob=logprob,
            parent=torch.cat([h.parent, n_parent], 1),
            valid=valid,
            drafter=drafter,
        )
