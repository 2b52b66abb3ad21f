"""Tree verification: which drafted nodes the target accepts, and the bonus token.

Inputs are the target's outputs at every tree node (the distribution of the token that follows
the node), flattened in the same order as :class:`DraftTrees`.

* Greedy (temperature 0): the accepted path is the longest root path whose every node equals the
  target's argmax at its parent; the bonus token is the argmax at the last accepted node. When
  two siblings carry the same token (possible with several drafters) the first sibling wins, the
  rule SGLang's ``verify_tree_greedy`` follows, so both layouts below agree.
* Stochastic (temperature > 0): recursive rejection sampling over siblings (SpecInfer-style).
  At the current node with target distribution p, children are tried in order; child x drawn
  from its drafter distribution q is accepted with probability min(1, p(x)/q(x)); on rejection p
  becomes the residual norm(max(p - q, 0)). Each child uses its *own* q, so siblings proposed by
  different drafters stay exact. A child that was picked deterministically (top-k) is a point
  mass: acceptance p(x), residual p with x removed. When no child is accepted the bonus token is
  drawn from the current residual; the committed tokens are then distributed exactly as the
  target's.

The ragged verifier works on the CSR tree; :func:`greedy_verify_padded` walks SGLang's retrieve
arrays of the padded view instead. They are independent implementations of one rule, so tests
check each against the other and against brute force.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from .pack import PackedBatch
from .tree import DETERMINISTIC, DraftTrees


@dataclass
class VerifyResult:
    accept_len: Tensor  # [B] accepted draft tokens (root excluded)
    accepted_nodes: Tensor  # [B, D+1] global node indices of the accepted path, root first; -1 pad
    new_tokens: Tensor  # [B, D+1] tokens committed this step: accepted drafts then the bonus; -1 pad
    bonus: Tensor  # [B]

    @property
    def num_committed(self) -> Tensor:
        return self.accept_len + 1


def _result(path: Tensor, accept_len: Tensor, tokens: Tensor, bonus: Tensor) -> VerifyResult:
    """Assemble a result from the accepted path ``[B, D+1]`` (root in column 0)."""
    B, width = path.shape
    cols = torch.arange(width, device=path.device)[None, :]
    drafted = torch.where(path[:, 1:] >= 0, tokens[path[:, 1:].clamp(min=0)], torch.full_like(path[:, 1:], -1))
    new = torch.cat([drafted, torch.full_like(path[:, :1], -1)], 1)
    new = torch.where(cols == accept_len[:, None], bonus[:, None], new)
    return VerifyResult(accept_len=accept_len, accepted_nodes=path, new_tokens=new, bonus=bonus)


def greedy_verify(trees: DraftTrees, target_logits: Tensor) -> VerifyResult:
    """Greedy verification on the ragged CSR batch; ``target_logits`` is ``[N, V]`` (or argmax ``[N]``)."""
    pred = target_logits if target_logits.dim() == 1 else target_logits.argmax(-1)
    N, B = trees.num_nodes, trees.batch_size
    dev = trees.tokens.device
    gp = trees.global_parents()
    is_root = gp < 0
    idx = torch.arange(N, device=dev)
    match = ~is_root & (trees.tokens == pred[gp.clamp(min=0)])
    # Only the first matching sibling counts (see module docstring).
    first = torch.full((N,), N, dtype=torch.int64, device=dev)
    first = first.scatter_reduce(0, gp.clamp(min=0), torch.where(match, idx, N), reduce="amin")
    match &= first[gp.clamp(min=0)] == idx
    ok = is_root | match
    D = int(trees.depth.max()) if N else 0
    for _ in range(D):  # a node is on the accepted path iff it and all its ancestors match
        ok = is_root | (match & ok[gp.clamp(min=0)])
    # The deepest accepted node of each request (unique: at most one accepted node per depth).
    key = torch.where(ok, trees.depth, torch.full_like(trees.depth, -1))
    req = trees.request_of_node
    best_depth = torch.full((B,), -1, dtype=torch.int64, device=dev).scatter_reduce(0, req, key, reduce="amax")
    is_best = ok & (trees.depth == best_depth[req])
    best = torch.zeros(B, dtype=torch.int64, device=dev).scatter_(0, req[is_best], idx[is_best])
    path = _walk_up(best, best_depth, gp, D)
    return _result(path, best_depth, trees.tokens, pred[best])


def _walk_up(leaf: Tensor, leaf_depth: Tensor, gp: Tensor, D: int) -> Tensor:
    """Root-to-leaf node indices ``[B, D+1]`` for each request's ``leaf``."""
    B = leaf.numel()
    path = torch.full((B, D + 1), -1, dtype=torch.int64, device=leaf.device)
    rows = torch.arange(B, device=leaf.device)
    cur, d = leaf.clone(), leaf_depth.clone()
    for _ in range(D + 1):
        live = d >= 0
        path[rows[live], d[live]] = cur[live]
        cur = torch.where(live, gp[cur], cur)
        d = d - 1
    return path


def _walk_from_roots(packed: PackedBatch, max_depth: int, choose) -> tuple[Tensor, Tensor, Tensor]:
    """Descend every request's tree from its root, one accepted child per level.

    ``choose(cur, alive)`` gets each request's current local slot and whether it is still
    descending, and returns the accepted child's slot (-1 to stop). Returns the accepted path as
    global node indices ``[B, max_depth+1]`` (root first, -1 pad), the accepted draft counts, and
    each request's last accepted local slot.
    """
    B = packed.retrieve_index.shape[0]
    dev = packed.retrieve_index.device
    rows = torch.arange(B, device=dev)
    cur = torch.zeros(B, dtype=torch.int64, device=dev)
    path = torch.full((B, max_depth + 1), -1, dtype=torch.int64, device=dev)
    path[:, 0] = 0
    alive = torch.ones(B, dtype=torch.bool, device=dev)
    depth = 0
    while True:
        chosen = choose(cur, alive)
        alive = chosen >= 0
        if not bool(alive.any()):
            break
        depth += 1
        path[rows[alive], depth] = chosen[alive]
        cur = torch.where(alive, chosen, cur)
    glob = torch.where(path >= 0, packed.retrieve_index.gather(1, path.clamp(min=0)), path)
    return glob, (path >= 0).sum(1) - 1, cur


def greedy_verify_padded(packed: PackedBatch, target_logits: Tensor) -> VerifyResult:
    """Greedy verification by walking the retrieve arrays, SGLang's ``verify_tree_greedy`` rule.

    ``target_logits`` is ``[B, W, V]`` (or argmax ``[B, W]``) over the padded view's slots.
    """
    pred = target_logits if target_logits.dim() == 2 else target_logits.argmax(-1)
    tokens, first_child, sibling = packed.padded.tokens, packed.retrieve_next_token, packed.retrieve_next_sibling
    rows = torch.arange(tokens.shape[0], device=tokens.device)

    def first_matching_child(cur: Tensor, alive: Tensor) -> Tensor:
        want = pred[rows, cur]
        c = torch.where(alive, first_child[rows, cur], -1)
        chosen = torch.full_like(c, -1)
        while bool((c >= 0).any()):  # walk every request's sibling list in lockstep
            hit = (c >= 0) & (tokens[rows, c.clamp(min=0)] == want)
            chosen = torch.where(hit, c, chosen)
            c = torch.where((c >= 0) & ~hit, sibling[rows, c.clamp(min=0)], -1)
        return chosen

    path, accept_len, cur = _walk_from_roots(packed, int(packed.padded.depth.max()), first_matching_child)
    flat_tokens = packed.padded.tokens[packed.padded.valid]
    return _result(path, accept_len, flat_tokens, pred[rows, cur])


def residual(p: Tensor, q: Tensor) -> Tensor:
    """norm(max(p - q, 0)), the distribution to sample from after rejecting a draft from q.

    The mass is zero only when p == q, where rejection has probability 0; p is kept then.
    """
    r = (p - q).clamp(min=0)
    norm = r.sum(-1, keepdim=True)
    return torch.where(norm > 0, r / norm.clamp(min=1e-30), p)


def stochastic_verify(
    trees: DraftTrees,
    packed: PackedBatch,
    target_probs: Tensor,
    generator: Optional[torch.Generator] = None,
) -> VerifyResult:
    """Lossless recursive rejection sampling; ``target_probs`` is ``[N, V]`` (already tempered)."""
    B = packed.retrieve_index.shape[0]
    dev = target_probs.device
    rows = torch.arange(B, device=dev)
    gidx = packed.retrieve_index
    dists = trees.proposal_dists
    bonus = torch.zeros(B, dtype=torch.int64, device=dev)

    def sample_child(cur: Tensor, alive: Tensor) -> Tensor:
        p = target_probs[gidx[rows, cur]].float().clone()  # [B, V] residual being refined
        c = torch.where(alive, packed.retrieve_next_token[rows, cur], -1)
        chosen = torch.full_like(c, -1)
        while bool((c >= 0).any()):
            tried = c >= 0
            node = gidx[rows, c.clamp(min=0)]
            x = trees.tokens[node]
            prop = trees.proposal[node]
            q = torch.zeros_like(p)
            sampled = tried & (prop != DETERMINISTIC)
            if bool(sampled.any()):
                q[sampled] = dists[prop[sampled]].float()
            point = tried & (prop == DETERMINISTIC)
            q[rows[point], x[point]] = 1.0
            px, qx = p[rows, x], q[rows, x]
            u = torch.rand(B, device=dev, generator=generator)
            accept = tried & (qx > 0) & (u * qx < px)  # u < min(1, p(x)/q(x))
            chosen = torch.where(accept, c, chosen)
            rejected = tried & ~accept
            p = torch.where(rejected[:, None], residual(p, q), p)
            c = torch.where(rejected, packed.retrieve_next_sibling[rows, c.clamp(min=0)], -1)
        stop = alive & (chosen < 0)  # no child accepted: the bonus comes from the residual
        if bool(stop.any()):
            bonus[stop] = torch.multinomial(p[stop], 1, generator=generator).squeeze(1)
        return chosen

    path, accept_len, _ = _walk_from_roots(packed, int(trees.depth.max()), sample_child)
    return _result(path, accept_len, trees.tokens, bonus)
