"""Do the fused control kernels build exactly the eager policy's steps on this device?

A server picks the fused control plane (``control_kernel: auto``) only after this check passes on
its own GPU, compiler and driver: a control kernel that lays a tree out wrongly makes the target
attend to the wrong tokens, and no later stage would notice. The check builds a few synthetic
steps (:mod:`sglang_echo.core.synthetic`; ties included, batch sizes across the kernels' warp
and chunk boundaries) with the eager policy and with the kernels (the elastic depths, then the
verify layout: ``pad_pool`` and ``dense_from_padded``) and compares every tensor. It costs the
kernels' compilation for those sizes, which the first served steps would pay anyway.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Optional

import torch

from ...core import build_trees, make_policy
from ...core.dense import dense_from_padded as eager_dense
from ...core.factory import PolicyConfig, max_tree_size
from ...core.pack import pad_pool as eager_pad_pool
from ...core.synthetic import SyntheticDrafter, SyntheticWorld
from ...core.tree import DraftTrees
from . import TRITON, layout

BATCHES = (1, 33, 96)  # one request; one past a 32-row grant chunk; several chunks, not a power of two
VOCAB = 3000


class _Coarse(SyntheticDrafter):
    """Log-probabilities rounded to halves: equal scores, so ties must break as the eager sorts do."""

    def propose(self, frontier, k):
        cands = super().propose(frontier, k)
        return replace(cands, logprob=(cands.logprob * 2).round() / 2)


def first_difference(
    policy: str, config: PolicyConfig, device: str | torch.device, batches: tuple[int, ...] = BATCHES
) -> Optional[str]:
    """None when the kernels reproduce the eager steps bit for bit, else what differed first."""
    width = max_tree_size(policy, config)
    for batch in batches:
        world = SyntheticWorld(batch, vocab=VOCAB, seed=batch, device=device)
        roots = torch.randint(0, VOCAB, (batch,), generator=torch.Generator().manual_seed(batch)).to(device)
        prefix = torch.randint(1, 500, (batch,), generator=torch.Generator().manual_seed(7)).to(device)
        k_max = max(2 * batch, config.k_max)
        built = {}
        for kernel in ("torch", "triton"):
            pol = make_policy(policy, replace(config, control_kernel=kernel), fused=TRITON)
            built[kernel] = build_trees(pol, _Coarse(world), roots, k_max)
        (t0, s0), (t1, _) = built["torch"], built["triton"]
        for f in fields(DraftTrees):
            a, b = getattr(t0, f.name), getattr(t1, f.name)
            if not ((a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))):
                return f"{policy} at batch {batch}: the fused trees' {f.name} differ from the eager ones"
        padded = eager_pad_pool(s0.pool, prefix, width)
        fused = layout.pad_pool(s0.pool, prefix, width)
        for name in ("tokens", "parents", "depth", "positions", "mask", "valid"):
            if not torch.equal(getattr(padded, name), getattr(fused, name)):
                return f"{policy} at batch {batch}: pad_pool's {name} differs from the eager layout"
        want, got = eager_dense(padded, prefix), layout.dense_from_padded(padded, prefix)
        for f in fields(want):
            a, b = getattr(want, f.name), getattr(got, f.name)
            if isinstance(a, torch.Tensor) and not torch.equal(a, b):
                return f"{policy} at batch {batch}: dense_from_padded's {f.name} differs from the eager layout"
    return None
