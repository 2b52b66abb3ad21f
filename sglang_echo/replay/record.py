"""``echo-replay record``: draft a deep, wide tree at every position of the target's greedy output.

The recording runs the repo's own offline loop (:func:`sglang_echo.eval.speculative_generate`)
with the real target and drafter, and :class:`ExplorePolicy` as the "policy": at every step it
drives the drafter through ``build_trees`` exactly as a live policy does (``propose(frontier, k)``
depth by depth, same drafter state), keeps everything the drafter proposed, and then hands the
loop a root-only tree, so the target verifies just the root and the loop advances one token per
step, i.e. plain greedy decoding. Every position is thus visited once, with the drafter in the
state it would be in there, and the loop's output is the greedy continuation.

What is explored. Every policy in :mod:`sglang_echo.core` expands, at each depth, the best few
children (by path score, Eq. 5) of the nodes it expanded at the previous depth: a beam search of
its own width (chain and budgeted chain: 1; ECHO: ``W_def`` while gates pass; EAGLE's static tree:
``topk``). Beams of different widths are not nested (the best child of a weak beam-1 node can
fall out of a wider beam), so the recording expands the *union* of several beams (``beams``),
asking the drafter for ``width`` children per expanded node, down to ``depth``. A per-tree node
cap (``max_nodes``, by path score) bounds the trace; what it prunes shows up as coverage misses
at replay, never as silently wrong trees.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from sglang_echo.core.policy import BuildState, TreePolicy, ranked
from sglang_echo.core.tree import Candidates, DraftTrees

from .trace import Trace, TraceMeta


@dataclass
class RowTree:
    """One recorded tree in BFS order (local indices), as :class:`Trace` stores it."""

    token: Tensor
    parent: Tensor
    depth: Tensor
    logprob: Tensor
    first_child: Tensor
    n_kept: Tensor
    n_avail: Tensor
    pruned: int = 0  # valid nodes dropped by the node cap


class ExplorePolicy(TreePolicy):
    """Expand the union of beam searches; record the pool; verify only the roots (see module doc).

    ``sink(step_trees)`` receives, after every step, one :class:`RowTree` per batch row (``None``
    for rows that were inactive). Only the first ``explore_steps`` steps draft at all.
    """

    name = "explore"

    def __init__(
        self,
        depth: int,
        width: int,
        beams: Sequence[int],
        max_nodes: int,
        sink: Callable[[list[Optional[RowTree]]], None],
        explore_steps: Optional[int] = None,
    ):
        if depth < 1 or width < 1 or not beams or min(beams) < 1 or max_nodes < 2:
            raise ValueError(
                f"need depth, width, beams >= 1 and max_nodes >= 2, got {depth}, {width}, {beams}, {max_nodes}"
            )
        self.max_depth, self.children_per_node = depth, width
        self.beams, self.max_nodes, self.sink = tuple(sorted(set(beams))), max_nodes, sink
        self.explore_steps, self.steps = explore_steps, 0

    def start(self, roots: Tensor, k_max: int | None = None) -> BuildState:
        state = super().start(roots, k_max)
        if self.explore_steps is not None and self.steps >= self.explore_steps:
            state.active[:] = False
        B = roots.numel()
        # Beam membership of every frontier column, one mask per beam width: [n_beams, B, F].
        state.extra["member"] = torch.ones(len(self.beams), B, 1, dtype=torch.bool, device=roots.device)
        state.extra["expanded"] = []  # (frontier slots, expanded mask) per depth
        state.extra["rows"] = state.active.clone()
        return state

    def advance(self, state: BuildState, cands: Candidates) -> None:
        pool, ex = state.pool, state.extra
        if state.depth == 0:  # _OnlyActive masks finished rows after start(): read them here
            ex["rows"] = state.active.clone()
        ex["expanded"].append((state.frontier_slots, (state.frontier_slots >= 0) & state.active[:, None]))
        d = state.depth + 1
        slots = pool.append(cands, state.frontier_slots, d)
        valid = pool.valid.gather(1, slots) & state.active[:, None]
        pool.valid.scatter_(1, slots, valid)  # inactive rows' candidates are not part of the record
        score = pool.score.gather(1, slots)
        # Each beam keeps the top-w children of its own previous members (a candidate belongs to
        # beam w iff its parent column did).
        in_beam = ex["member"].gather(2, cands.parent.clamp(min=0)[None].expand(len(self.beams), -1, -1)) & valid[None]
        chosen = torch.zeros_like(in_beam)
        for i, w in enumerate(self.beams):
            order, n = ranked(score, in_beam[i])
            top = order[:, :w]
            ok = torch.arange(top.shape[1], device=top.device)[None, :] < n.clamp(max=w)[:, None]
            chosen[i].scatter_(1, top, ok)
        union = chosen.any(0)
        order, n = ranked(score, union)
        width = max(int(n.max()) if n.numel() else 0, 1)
        cols = order[:, :width]
        fill = torch.arange(width, device=cols.device)[None, :] < n[:, None]
        state.set_frontier(torch.where(fill, slots.gather(1, cols), -1), torch.where(fill, cols, -1))
        ex["member"] = chosen.gather(2, cols[None].expand(len(self.beams), -1, -1)) & fill[None]
        state.active = state.active & (n > 0)
        state.depth = d

    def finish(self, state: BuildState) -> DraftTrees:
        pool = state.pool
        rows = state.extra["rows"]
        out: list[Optional[RowTree]] = [None] * pool.batch_size
        if self.explore_steps is None or self.steps < self.explore_steps:
            hits = torch.zeros(pool.valid.shape, dtype=torch.int64, device=pool.valid.device)
            for fslots, mask in state.extra["expanded"]:  # padding (-1) adds 0 to slot 0
                hits.scatter_add_(1, fslots.clamp(min=0), mask.long())
            expanded = (hits > 0).cpu()
            for b in range(pool.batch_size):
                if bool(rows[b]):
                    out[b] = compact_row(pool, b, expanded[b], self.max_nodes)
        self.steps += 1
        self.sink(out)
        return pool.compact()  # only the roots are kept: the target verifies the roots (plain decoding)


def compact_row(pool, b: int, expanded: Tensor, max_nodes: int) -> RowTree:
    """Row ``b`` of the pool as a BFS-ordered tree with contiguous, drafter-ordered children."""
    valid = pool.valid[b].cpu().clone()
    valid[0] = True
    parent, depth, score = pool.parent[b].cpu(), pool.depth[b].cpu(), pool.score[b].cpu()
    tokens, logprob = pool.tokens[b].cpu(), pool.logprob[b].cpu()
    P = valid.numel()
    # Children the drafter returned per expanded node (before the cap): n_avail.
    is_child = valid.clone()
    is_child[0] = False
    n_avail = torch.zeros(P, dtype=torch.int64).scatter_add_(0, parent.clamp(min=0), is_child.long())
    n_avail = torch.where(expanded, n_avail, torch.full_like(n_avail, -1))
    keep = valid
    pruned = 0
    if int(valid.sum()) > max_nodes:
        # Keep the max_nodes best by path score (stable: the root and parents, earlier slots, win
        # ties); path scores never increase along a path, so this is ancestor-closed but we
        # enforce closure anyway against rounding.
        masked = torch.where(valid, score, torch.full_like(score, float("-inf")))
        masked[0] = float("inf")
        top = torch.sort(masked, descending=True, stable=True).indices[:max_nodes]
        keep = torch.zeros_like(valid).scatter_(0, top, True)
        for _ in range(int(depth[keep].max())):
            keep = keep & ((parent < 0) | keep[parent.clamp(min=0)])
        pruned = int(valid.sum() - keep.sum())
    # BFS order, depth by depth: siblings sorted by their parent's new index, then by slot, i.e.
    # the drafter's own column order (best first for every drafter in this repo).
    new = torch.full((P,), -1, dtype=torch.int64)
    new[0] = 0
    order = [torch.zeros(1, dtype=torch.int64)]
    n = 1
    for d in range(1, int(depth[keep].max()) + 1 if bool(keep.any()) else 1):
        s = (keep & (depth == d)).nonzero().squeeze(1)
        if s.numel() == 0:
            break
        key = new[parent[s]] * P + s
        s = s[torch.argsort(key)]
        new[s] = torch.arange(n, n + s.numel())
        order.append(s)
        n += s.numel()
    slots = torch.cat(order)
    par_new = torch.where(parent[slots] >= 0, new[parent[slots].clamp(min=0)], -1)
    par_new[0] = -1
    n_kept = torch.zeros(n, dtype=torch.int64).scatter_add_(0, par_new.clamp(min=0), (par_new >= 0).long())
    # Children are contiguous: the first child of a node is the smallest index pointing at it.
    first = torch.full((n,), n, dtype=torch.int64).scatter_reduce(
        0, par_new.clamp(min=0), torch.where(par_new >= 0, torch.arange(n), n), reduce="amin"
    )
    first = torch.where(n_kept > 0, first, torch.full_like(first, -1))
    lp = logprob[slots].clone()
    lp[0] = 0.0
    return RowTree(
        token=tokens[slots].clone(),
        parent=par_new,
        depth=depth[slots].clone(),
        logprob=lp,
        first_child=first,
        n_kept=n_kept,
        n_avail=n_avail[slots],
        pruned=pruned,
    )


def record(
    target,
    drafter,
    prompts: Sequence[Tensor],
    *,
    max_new: int,
    depth: int,
    width: int,
    beams: Sequence[int],
    max_nodes: int,
    batch: int = 8,
    progress=None,
) -> tuple[list[list[RowTree]], list[list[int]], float]:
    """Record ``prompts`` in batches of ``batch``; returns (trees per prompt, outputs, seconds).

    Each output runs ``max_new + depth`` tokens (eos ignored: the replay stops streams at eos
    itself) so the last trees' paths can be checked against the true continuation.
    """
    from sglang_echo.eval.loop import speculative_generate

    trees: list[list[RowTree]] = [[] for _ in prompts]
    outputs: list[list[int]] = [[] for _ in prompts]
    t0 = time.perf_counter()
    for lo in range(0, len(prompts), batch):
        chunk = list(prompts[lo : lo + batch])
        per_step: list[list[Optional[RowTree]]] = []

        def sink(rows, _acc=per_step):
            _acc.append(rows)
            if progress is not None:
                progress(1)

        policy = ExplorePolicy(depth, width, beams, max_nodes, sink, explore_steps=max_new - 1)
        res = speculative_generate(target, drafter, policy, chunk, max_new + depth, eos_id=None)
        for b in range(len(chunk)):
            trees[lo + b] = [step[b] for step in per_step[: max_new - 1]]
            outputs[lo + b] = res.tokens[b]
            if any(t is None for t in trees[lo + b]) or len(trees[lo + b]) != max_new - 1:
                raise RuntimeError(f"prompt {lo + b}: expected {max_new - 1} recorded trees")
    return trees, outputs, time.perf_counter() - t0


def assemble(meta: TraceMeta, prompts: Sequence[Tensor], trees: list[list[RowTree]], outputs: list[list[int]]) -> Trace:
    """Concatenate per-prompt recordings into one :class:`Trace`."""
    flat = [t for per in trees for t in per]

    def cat(name: str, dtype=torch.int64) -> Tensor:
        return torch.cat([getattr(t, name) for t in flat]).to(dtype) if flat else torch.zeros(0, dtype=dtype)

    def indptr(lengths) -> Tensor:
        out = torch.zeros(len(lengths) + 1, dtype=torch.int64)
        out[1:] = torch.tensor(list(lengths), dtype=torch.int64).cumsum(0) if len(lengths) else out[1:]
        return out

    meta.stats.update(
        trees=len(flat),
        nodes=int(sum(t.token.numel() for t in flat)),
        pruned_nodes=int(sum(t.pruned for t in flat)),
        trees_pruned=int(sum(t.pruned > 0 for t in flat)),
        mean_nodes_per_tree=(sum(t.token.numel() for t in flat) / len(flat)) if flat else 0.0,
    )
    trace = Trace(
        meta=meta,
        prompt_indptr=indptr([int(p.numel()) for p in prompts]),
        prompt_tokens=torch.cat([p.reshape(-1).long() for p in prompts])
        if prompts
        else torch.zeros(0, dtype=torch.int64),
        output_indptr=indptr([len(o) for o in outputs]),
        output_tokens=torch.tensor([x for o in outputs for x in o], dtype=torch.int64),
        tree_indptr=indptr([len(per) for per in trees]),
        node_indptr=indptr([t.token.numel() for t in flat]),
        token=cat("token"),
        parent=cat("parent"),
        depth=cat("depth"),
        logprob=cat("logprob", torch.float32),
        first_child=cat("first_child"),
        n_kept=cat("n_kept"),
        n_avail=cat("n_avail"),
    )
    trace.check()
    return trace
