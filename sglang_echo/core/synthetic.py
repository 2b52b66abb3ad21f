"""A synthetic drafter/target pair for tests and the control-plane benchmark.

Everything is a deterministic hash of (request, depth, parent token), so a node proposes the same
children whichever policy asks, and the target's greedy choice at a node is fixed. The drafter is
calibrated by construction: its top-1 probability at a node is the chance that the target agrees
with it, and each request has its own difficulty, so confidence is informative (as the paper's
Fig. 2 shows for real drafters) and trees of different requests differ in shape.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .policy import Frontier
from .tree import Candidates, DraftTrees

_MASK = 0x7FFFFFFF


def _mix(*xs: Tensor) -> Tensor:
    """A small integer hash of int64 tensors (LCG rounds, kept inside 31 bits)."""
    h = torch.zeros_like(xs[0])
    for x in xs:
        h = ((h ^ (x & _MASK)) * 1103515245 + 12345) & _MASK
        h = ((h ^ (h >> 13)) * 69069 + 1) & _MASK
    return h


def _uniform(h: Tensor) -> Tensor:
    return (h % 1_000_003).double().div(1_000_003).float()


class SyntheticWorld:
    """``B`` requests over a ``vocab``-token vocabulary; ``ease[b]`` in (0, 1) sets how often the
    drafter's top-1 matches the target for request b (decaying with depth)."""

    def __init__(
        self,
        batch_size: int,
        vocab: int = 1000,
        seed: int = 0,
        ease: Tensor | None = None,
        decay: float = 0.9,
        device: torch.device | str = "cpu",
    ):
        g = torch.Generator().manual_seed(seed)  # drawn on the CPU: the same world on every device
        self.vocab, self.decay, self.device = vocab, decay, torch.device(device)
        self.req_key = torch.randint(1, _MASK, (batch_size,), generator=g).to(self.device)
        ease = ease if ease is not None else torch.rand(batch_size, generator=g) * 0.8 + 0.15
        self.ease = ease.to(self.device)

    def _top1_prob(self, req: Tensor, depth: Tensor, token: Tensor) -> Tensor:
        jitter = _uniform(_mix(self.req_key[req], depth, token, torch.full_like(token, 7))) - 0.5
        base = self.ease[req] * self.decay ** depth.float()
        return (base + 0.3 * jitter).clamp(0.02, 0.98)

    def children(self, req: Tensor, depth: Tensor, token: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """Top-k children tokens ``[..., k]`` and their drafter probabilities, for nodes at ``depth``."""
        h = _mix(self.req_key[req], depth, token)
        ranks = torch.arange(k, device=token.device)
        # Distinct tokens per node: an offset walk with a step coprime to most vocabularies.
        toks = (h[..., None] + ranks * 7919) % self.vocab
        p1 = self._top1_prob(req, depth, token)
        # Geometric tail sharing the remaining mass: q_r ∝ (1 - p1) * 0.5^r for r >= 1.
        tail = (1 - p1)[..., None] * 0.5 ** ranks.float()[1:] * 0.5
        probs = torch.cat([p1[..., None], tail], -1)
        return toks, probs

    def target_next(self, req: Tensor, depth: Tensor, token: Tensor) -> Tensor:
        """The target's greedy next token after a node at ``depth`` holding ``token``."""
        toks, probs = self.children(req, depth, token, 4)
        u = _uniform(_mix(self.req_key[req], depth, token, torch.full_like(token, 99)))
        cum = probs.cumsum(-1)
        rank = (u[..., None] >= cum).sum(-1)  # agrees with draft rank r w.p. q_r
        off_tree = (_mix(token, depth, self.req_key[req]) % self.vocab + 3 * 7919 + 1) % self.vocab
        return torch.where(rank < 4, toks.gather(-1, rank.clamp(max=3)[..., None]).squeeze(-1), off_tree)

    def target_argmax(self, trees: DraftTrees) -> Tensor:
        """``[N]`` target predictions at every node of ``trees`` (input for greedy_verify)."""
        return self.target_next(trees.request_of_node, trees.depth, trees.tokens)


class SyntheticDrafter:
    """Implements the drafter side of :func:`~sglang_echo.core.policy.build_trees` on a world."""

    def __init__(self, world: SyntheticWorld):
        self.world = world

    def propose(self, frontier: Frontier, k: int) -> Candidates:
        B, F = frontier.slots.shape
        dev = frontier.tokens.device
        req = torch.arange(B, device=dev)[:, None].expand(B, F)
        toks, probs = self.world.children(req, torch.full((B, F), frontier.depth, device=dev), frontier.tokens, k)
        valid = frontier.valid[:, :, None].expand(B, F, k)
        return Candidates(
            tokens=toks.reshape(B, F * k),
            logprob=probs.log().reshape(B, F * k),
            parent=torch.arange(F, device=dev)[None, :, None].expand(B, F, k).reshape(B, F * k),
            valid=valid.reshape(B, F * k),
        )
