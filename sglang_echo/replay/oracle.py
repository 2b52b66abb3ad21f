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
