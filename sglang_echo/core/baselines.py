"""Baseline tree policies, on the same machinery as ECHO so comparisons differ only in policy.

* :class:`Autoregressive`: no drafts; every request verifies its root (plain decoding).
* :class:`Chain`: one candidate per depth, ``depth`` deep.
* :class:`StaticTree`: EAGLE-2/3's static tree: expand the ``topk`` best nodes per depth with
  ``topk`` children each, pool every candidate, then keep the ``total_tokens - 1`` best by path
  score (the global re-rank). EAGLE-3's defaults are 8/10/60, the paper's streamlined 3/3/5.
* :class:`BeamTree`: expand the ``width`` best nodes per depth and keep exactly those beams, so
  every depth up to ``depth`` carries ``width`` nodes (no global re-rank). It is the calibration
  probe tree (``echo-calibrate``): every depth is drafted and verified, so each gets labels.
* :class:`BudgetedChain`: every request drafts a chain, then the batch keeps the top
  ``K_max - B`` nodes by survival probability ``exp(S)`` (as SGLang's DSPARK allocates chains).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .policy import BuildState, TreePolicy, ranked, take_top
from .tree import Candidates


class Autoregressive(TreePolicy):
    name = "ar"
    max_depth = 0

    def advance(self, state: BuildState, cands: Candidates) -> None:  # never called: depth 0
        raise AssertionError("autoregressive decoding drafts nothing")


class _BeamPolicy(TreePolicy):
    """Expand the ``beam`` best candidates of each depth; subclasses choose what to keep."""

    beam: int = 1
    keep_all: bool = True

    def advance(self, state: BuildState, cands: Candidates) -> None:
        pool = state.pool
        d = state.depth + 1
        slots = pool.append(cands, state.frontier_slots, d)
        valid = pool.newest(pool.valid, slots) & state.active[:, None]
        order, n_valid = ranked(pool.newest(pool.score, slots), valid)
        frontier, cols = take_top(slots, order, n_valid.clamp(max=self.beam), self.beam)
        if self.keep_all:
            pool.mark(slots, valid)
        else:  # keep nothing yet, but drop what the active mask excluded from the later re-rank
            pool.valid.scatter_(1, slots, valid)
        state.set_frontier(frontier, cols)
        state.active = state.active & (n_valid > 0)
        state.depth = d


class Chain(_BeamPolicy):
    def __init__(self, depth: int):
        self.name, self.max_depth = f"chain-{depth}", depth


class StaticTree(_BeamPolicy):
    keep_all = False

    def __init__(self, depth: int = 8, topk: int = 10, total_tokens: int = 60):
        if total_tokens < 1:
            raise ValueError("total_tokens counts the root, so it is at least 1")
        self.name = f"static-tree-{depth}x{topk}x{total_tokens}"
        self.max_depth, self.beam, self.children_per_node = depth, topk, topk
        self.total_tokens = total_tokens

    def select(self, state: BuildState) -> None:
        pool = state.pool
        drafts = pool.valid.clone()
        drafts[:, 0] = False
        # Stable sort: a child never outranks its parent (S never increases along a path, and on
        # ties the parent's smaller slot wins), so the kept set is ancestor-closed.
        order, n_valid = ranked(pool.score, drafts)
        slots = torch.arange(pool.size, device=order.device).expand_as(order)
        kept, _ = take_top(slots, order, n_valid.clamp(max=self.total_tokens - 1), self.total_tokens - 1)
        pool.mark(kept, kept >= 0)


class BeamTree(_BeamPolicy):
    keep_all = False

    def __init__(self, depth: int = 8, width: int = 4):
        self.name = f"beam-tree-{depth}x{width}"
        self.max_depth, self.beam, self.children_per_node = depth, width, width

    def advance(self, state: BuildState, cands: Candidates) -> None:
        super().advance(state, cands)
        state.pool.mark(state.frontier_slots, state.frontier_slots >= 0)  # the beam is the tree


class BudgetedChain(_BeamPolicy):
    keep_all = False
    budgeted = True

    def __init__(self, k_max: int, depth: int = 8):
        self.name, self.max_depth, self.k_max = "budgeted-chain", depth, k_max

    def start(self, roots: Tensor, k_max: int | None = None) -> BuildState:
        state = super().start(roots)
        state.budget = max((self.k_max if k_max is None else k_max) - roots.numel(), 0)
        state.active &= state.budget > 0
        return state

    def select(self, state: BuildState) -> None:
        pool = state.pool
        drafts = pool.valid.clone()
        drafts[:, 0] = False
        flat = torch.where(drafts, pool.score, float("-inf")).flatten()
        n = drafts.sum().clamp(max=state.budget)  # a device scalar: no host sync
        # Batch-wide top-(K_max - B) by survival probability; chains are prefix-closed because
        # S decreases along a chain and the stable sort prefers the parent's earlier slot on ties.
        order = torch.sort(flat, descending=True, stable=True).indices
        top = torch.arange(flat.numel(), device=flat.device) < n
        keep = torch.zeros_like(flat, dtype=torch.bool).scatter_(0, order, top)
        pool.keep |= keep.view_as(pool.keep)
        state.budget = state.budget - n
