"""The oracle under a verification cap: the most accepted tokens any allocation could get.

Knowing the greedy continuation, request ``i``'s recorded tree contains a true path of length
``a_i`` (capped at the policy's depth). A verified slot accepts a token only if it lies on that
path, and a request's root costs one slot whatever happens (Eq. 4 counts roots), so with
``K_max`` slots for ``B`` requests the best any scheduler could do is to spend the
``K_max - B`` draft slots on true-path nodes::

    J* = min(sum_i a_i, max(K_max - B, 0))          (Eq. 11's objective, at its maximum)

Every policy's accepted count ``sum_i L_i`` is at most this when it verifies at most ``K_max``
tokens (``L_i <= a_i`` because its tree is a subset of the recorded one, and
``L_i <= K_i - 1``). :func:`oracle_accepted` with ``budget`` = the tokens a policy actually
verified bounds unbudgeted policies the same way.
"""

from __future__ import annotations

import torch
from torch import Tensor


def oracle_accepted(true_len: Tensor, active: Tensor, budget: int, max_depth: int) -> int:
    """``min(sum a_i, budget - B)`` over the active requests; ``B`` counts every verified root."""
    a = torch.where(active, true_len.clamp(max=max_depth), torch.zeros_like(true_len))
    roots = int(true_len.numel())
    return int(min(int(a.sum()), max(budget - roots, 0)))


class RankedReference:
    """What trusting the drafter's scores alone gets under the same cap: every recorded node of
    depth ``1 .. max_depth`` competes batch-wide, and the ``K_max - B`` best by path score S
    (Eq. 5) are verified, with no gates and no drafting cost counted.

    It sits between a policy and the oracle: the oracle knows which nodes the target accepts,
    this reference knows only what any scheduler could know from the drafter (the scores of a
    fully drafted tree), so ``policy / ranked`` is the share a score-driven scheduler could still
    win and ``ranked / oracle`` the share no ranking by these scores can reach. The kept set is
    ancestor-closed (S never increases along a path; on ties the stable sort keeps the parent,
    which comes first in BFS order), so the true-path nodes it keeps are an accepted prefix.
    """

    def __init__(self, trace, max_depth: int) -> None:
        self.node_indptr = trace.node_indptr
        self.score = trace.path_scores
        self.on_path = trace.on_true_path
        self.drafted = (trace.depth >= 1) & (trace.depth <= max_depth)

    def accepted(self, trees: Tensor, budget: int) -> int:
        """``trees``: ``[B]`` the recorded tree of each batch row (-1: inactive, still a root)."""
        n = max(budget - trees.numel(), 0)
        live = trees[trees >= 0]
        if n == 0 or live.numel() == 0:
            return 0
        lo, counts = self.node_indptr[live], self.node_indptr[live + 1] - self.node_indptr[live]
        first = torch.cumsum(counts, 0) - counts  # each tree's offset in the flat list
        nodes = torch.arange(int(counts.sum())) + torch.repeat_interleave(lo - first, counts)  # global ids
        nodes = nodes[self.drafted[nodes]]
        top = torch.sort(self.score[nodes], descending=True, stable=True).indices[:n]
        return int(self.on_path[nodes[top]].sum())
