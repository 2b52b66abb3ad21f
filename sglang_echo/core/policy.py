"""The tree-policy interface and the loop that interleaves drafting with scheduling.

One speculative step builds every request's tree depth by depth (ECHO Alg. 1 works the same
way)::

    state = policy.start(roots, k_max)           # depth 0: every tree is its root; the cap
    while not state.done:
        cands = drafter.propose(state.frontier(), policy.children_per_node)
        policy.advance(state, cands)             # gates, budget, which nodes enter the trees
    trees = policy.finish(state)                 # select() (e.g. ECHO's width expansion,
                                                 # EAGLE's re-rank), then compaction

Contract:

* ``drafter.propose(frontier, k)`` returns :class:`Candidates` with up to ``k`` children for every
  valid slot of ``frontier`` whose request is active; ``Candidates.parent`` is the frontier column.
  The drafter only has to expand active requests: the policy drops everything else.
* ``policy.advance`` appends the candidates to the node pool, marks which enter the trees, sets
  the next frontier (which candidates the drafter expands next; ``Frontier.source`` names them by
  their column in the candidates, so a drafter can keep its hidden states per candidate) and
  deactivates requests that stop drafting.
* ``policy.select`` makes the last choices once no depth is left (marks more pool slots);
  ``finish`` is ``select`` plus compaction, so a caller that lays the pool out itself (the CUDA
  graph builder, :mod:`sglang_echo.core.graphs`) calls ``select`` alone.
* A policy never keeps more than its budget allows: for budgeted policies the verified tokens of
  the step, roots included, stay within ``max(k_max, batch_size)`` (Eq. 4; when the batch alone
  exceeds the cap every request verifies only its root, i.e. plain decoding).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Optional, Protocol

import torch
from torch import Tensor

from .tree import Candidates, DraftTrees, NodePool


@dataclass
class Frontier:
    """The nodes the drafter expands next, padded ``[B, F]``."""

    depth: int  # depth of the frontier nodes (0 = roots); children get depth + 1
    slots: Tensor  # [B, F] pool slots, -1 = empty
    source: Tensor  # [B, F] column of each node in the previous Candidates (-1 for roots / empty)
    tokens: Tensor  # [B, F] token ids (0 where empty)
    path_score: Tensor  # [B, F] S of each frontier node
    active: Tensor  # [B] bool: requests the drafter must expand

    @property
    def valid(self) -> Tensor:
        return (self.slots >= 0) & self.active[:, None]


@dataclass
class BuildState:
    """Mutable state of one step's tree construction."""

    pool: NodePool
    max_depth: int
    depth: int = 0
    frontier_slots: Tensor = None  # [B, F]
    frontier_source: Tensor = None  # [B, F]
    active: Tensor = None  # [B] bool
    budget: int | Tensor = 0  # draft tokens still allowed this step (budgeted policies; ECHO: 0-d tensor)
    gate_evaluated: Tensor = None  # [max_depth + 1] gates evaluated per depth
    gate_passed: Tensor = None  # [max_depth + 1] gates passed per depth
    frontier_values: Optional[tuple[Tensor, Tensor]] = None  # see set_frontier
    extra: dict = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.depth >= self.max_depth or not bool(self.active.any())

    def frontier(self) -> Frontier:
        slots = self.frontier_slots
        if self.frontier_values is not None:  # set by a policy that has them at hand (a fused kernel)
            tokens, path_score = self.frontier_values
        else:
            safe, empty = slots.clamp(min=0), slots < 0
            tokens = self.pool.tokens.gather(1, safe).masked_fill(empty, 0)
            path_score = self.pool.score.gather(1, safe).masked_fill(empty, float("-inf"))
        return Frontier(
            depth=self.depth,
            slots=slots,
            source=self.frontier_source,
            tokens=tokens,
            path_score=path_score,
            active=self.active,
        )

    def set_frontier(self, slots: Tensor, source: Tensor, values: Optional[tuple[Tensor, Tensor]] = None) -> None:
        """``values``: the frontier's (tokens, path scores), 0 and -inf where empty, if known."""
        self.frontier_slots, self.frontier_source, self.frontier_values = slots, source, values


class TreeDrafter(Protocol):
    def propose(self, frontier: Frontier, k: int) -> Candidates: ...


class TreePolicy(ABC):
    """Decides, depth by depth, which drafted candidates enter each request's tree."""

    name: str = "policy"
    max_depth: int = 0
    children_per_node: int = 1  # k: children the drafter proposes per frontier node
    budgeted: bool = False  # whether the policy honours the K_max cap (Eq. 4)
    pool_capacity: Optional[int] = None  # preallocated pool columns (a fused kernel writes them in place)

    def start(self, roots: Tensor, k_max: int | None = None) -> BuildState:
        """Depth 0: every tree is its root. ``k_max``: the step's cap, roots included, for budgeted
        policies (None: their own)."""
        B, dev = roots.numel(), roots.device
        state = BuildState(
            pool=NodePool(roots, self.pool_capacity),
            max_depth=self.max_depth,
            active=torch.full((B,), self.max_depth > 0, dtype=torch.bool, device=dev),
            gate_evaluated=torch.zeros(self.max_depth + 1, dtype=torch.int64, device=dev),
            gate_passed=torch.zeros(self.max_depth + 1, dtype=torch.int64, device=dev),
        )
        state.set_frontier(torch.zeros(B, 1, dtype=torch.int64, device=dev), torch.full((B, 1), -1, device=dev))
        return state

    @abstractmethod
    def advance(self, state: BuildState, cands: Candidates) -> None: ...

    def select(self, state: BuildState) -> None:
        """Final choices after the last depth (mark more slots); nothing by default."""

    def finish(self, state: BuildState) -> DraftTrees:
        self.select(state)
        return state.pool.compact()


def build_trees(
    policy: TreePolicy, drafter: TreeDrafter, roots: Tensor, k_max: int | None = None
) -> tuple[DraftTrees, BuildState]:
    """Run one step's draft-and-schedule loop (see the module docstring).

    ``k_max``: this step's verification cap, roots included, in place of the policy's own (a
    server's :class:`~sglang_echo.core.kmax.KMax` at this batch size, or a per-step budget such as
    :class:`~sglang_echo.core.budget.CostModelBudget`'s); only budgeted policies have one.
    """
    state = policy.start(roots, k_max)
    while not state.done:
        policy.advance(state, drafter.propose(state.frontier(), policy.children_per_node))
    return policy.finish(state), state


def ranked(score: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """Candidate columns per request by descending path score (stable), and valid counts."""
    masked = torch.where(valid, score, float("-inf"))
    order = torch.sort(masked, dim=1, descending=True, stable=True).indices
    return order, valid.sum(1)


def take_top(slots: Tensor, order: Tensor, n: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """The first ``n[b]`` ranked slots of each request, padded to ``width``: (slots, columns)."""
    if order.shape[1] < width:  # fewer candidates than slots: pad with the (masked) first column
        order = torch.nn.functional.pad(order, (0, width - order.shape[1]))
    cols = order[:, :width]
    mask = torch.arange(width, device=slots.device)[None, :] < n.clamp(max=order.shape[1])[:, None]
    return torch.where(mask, slots.gather(1, cols), -1), torch.where(mask, cols, -1)


def grant_in_priority(want: Tensor, priority: Tensor, budget: int | Tensor) -> Tensor:
    """Hand out ``budget`` tokens to requests in descending ``priority``, each up to ``want``.

    The vectorised form of Alg. 1's ``for i in active_set if budget > 0`` loop: a prefix sum
    over requests sorted by priority; the last one served may get a partial grant.
    """
    order = torch.sort(priority, descending=True, stable=True).indices
    w = want[order]
    before = w.cumsum(0) - w
    g = (budget - before).clamp(min=0).minimum(w)
    return torch.zeros_like(want).scatter_(0, order, g)
