"""A preallocated :class:`~sglang_echo.core.tree.NodePool` (``capacity``) holds exactly what the
growing one does; :meth:`reserve` refuses to run past its capacity."""

from __future__ import annotations

import pytest
import torch

from sglang_echo.core.tree import Candidates, NodePool


def cands(B, C, F, seed):
    g = torch.Generator().manual_seed(seed)
    return Candidates(
        tokens=torch.randint(0, 100, (B, C), generator=g),
        logprob=-torch.rand(B, C, generator=g),
        parent=torch.randint(0, F, (B, C), generator=g),
        valid=torch.rand(B, C, generator=g) > 0.2,
    )


def test_preallocated_pool_equals_growing_pool():
    roots = torch.arange(5)
    grown, fixed = NodePool(roots), NodePool(roots, capacity=1 + 3 + 6)
    frontier = torch.zeros(5, 1, dtype=torch.int64)
    for depth, C in ((1, 3), (2, 6)):
        c = cands(5, C, frontier.shape[1], depth)
        slots = grown.append(c, frontier, depth)
        assert torch.equal(slots, fixed.append(c, frontier, depth))
        for pool in (grown, fixed):
            pool.mark(slots[:, :2], torch.ones(5, 2, dtype=torch.bool))
        frontier = slots[:, :2]
    for f in NodePool.FIELDS:
        assert torch.equal(getattr(grown, f), getattr(fixed, f)), f
    trees_a, trees_b = grown.compact(), fixed.compact()
    assert torch.equal(trees_a.tokens, trees_b.tokens) and torch.equal(trees_a.parents, trees_b.parents)
    with pytest.raises(ValueError, match="capacity"):
        fixed.reserve(1)
    with pytest.raises(ValueError, match="capacity"):
        grown.reserve(1)
