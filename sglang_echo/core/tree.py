"""Draft trees: the data that crosses every seam of the ECHO core.

A batch of trees is stored flattened request by request (CSR): request ``i`` owns nodes
``indptr[i]:indptr[i+1]``, its first node is the root (the last committed token, depth 0) and
nodes are topologically ordered (every parent precedes its children). Parents are *local*
indices inside the request, so a request's slice is a self-contained tree.

Drafters do not build trees directly: at every depth they return :class:`Candidates` (padded
``[B, C]`` proposals whose parents point into the current frontier) and a policy decides which
candidates enter the tree. :class:`NodePool` accumulates them as padded ``[B, P]`` tensors so a
whole depth is one vectorised append, and compacts the kept nodes into :class:`DraftTrees` once.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cached_property
from typing import Optional

import torch
from torch import Tensor

DETERMINISTIC = -1
"""``proposal`` value of a node that was *picked* (e.g. top-k), not sampled, by its drafter.

Stochastic verification treats such a node as drawn from a point mass on its token, which keeps
rejection sampling exact (see :mod:`sglang_echo.core.verify`)."""


@dataclass
class DraftTrees:
    """A ragged batch of draft trees (CSR over requests)."""

    indptr: Tensor  # [B+1] int64 node offsets
    tokens: Tensor  # [N] int64
    parents: Tensor  # [N] int64 local parent index, -1 for roots
    depth: Tensor  # [N] int64, 0 for roots
    logprob: Tensor  # [N] float32 log q(token | path) under the node's drafter, 0 for roots
    path_score: Tensor  # [N] float32 S_{i,d,j} (Eq. 5), 0 for roots
    drafter: Tensor  # [N] int64 id of the drafter that produced the node
    proposal: Tensor  # [N] int64 row of `proposal_dists` the token was sampled from, or DETERMINISTIC
    proposal_dists: Optional[Tensor] = None  # [M, V] float32 drafter distributions (temperature > 0)

    @property
    def batch_size(self) -> int:
        return self.indptr.numel() - 1

    @property
    def num_nodes(self) -> int:
        return self.tokens.numel()

    @property
    def sizes(self) -> Tensor:
        """Nodes per request, root included: the tokens each request submits to verification."""
        return self.indptr[1:] - self.indptr[:-1]

    @cached_property
    def request_of_node(self) -> Tensor:
        """[N] request of every node (a cumulative count of request starts; cached)."""
        starts = torch.zeros(self.num_nodes + 1, dtype=torch.int64, device=self.indptr.device)
        starts.index_add_(
            0, self.indptr[1:-1], torch.ones(self.batch_size - 1, dtype=torch.int64, device=starts.device)
        )
        return starts[:-1].cumsum(0)

    @cached_property
    def local_index(self) -> Tensor:
        """[N] index of every node inside its own request (cached)."""
        return torch.arange(self.num_nodes, device=self.indptr.device) - self.indptr[self.request_of_node]

    def global_parents(self) -> Tensor:
        """Parents as indices into the flattened batch (-1 for roots)."""
        base = self.indptr[self.request_of_node]
        return torch.where(self.parents >= 0, self.parents + base, self.parents)

    def max_depth(self) -> Tensor:
        """Deepest node of each request, [B]."""
        out = torch.zeros(self.batch_size, dtype=torch.int64, device=self.depth.device)
        return out.scatter_reduce(0, self.request_of_node, self.depth, reduce="amax")

    def request(self, i: int) -> "DraftTrees":
        """Request ``i`` alone, as a batch of one (for debugging and reference checks)."""
        lo, hi = int(self.indptr[i]), int(self.indptr[i + 1])
        per_node = {
            f.name: getattr(self, f.name)[lo:hi] for f in fields(self) if f.name not in ("indptr", "proposal_dists")
        }
        return replace(self, indptr=torch.tensor([0, hi - lo], device=self.indptr.device), **per_node)


@dataclass
class Candidates:
    """One depth of drafter proposals, padded to ``C`` per request.

    ``parent`` indexes the frontier the drafter was asked to expand (``[B, F]``), so drafters never
    see the tree layout. Invalid slots (requests not expanded, or fewer proposals) are masked out.
    """

    tokens: Tensor  # [B, C] int64
    logprob: Tensor  # [B, C] float32 log q(token | parent path)
    parent: Tensor  # [B, C] int64 frontier slot of the parent
    valid: Tensor  # [B, C] bool
    drafter: Optional[Tensor] = None  # [B, C] int64, default 0
    proposal: Optional[Tensor] = None  # [B, C] int64 rows of `proposal_dists`, default DETERMINISTIC
    proposal_dists: Optional[Tensor] = None  # [M, V] distributions referenced by `proposal`


class NodePool:
    """Every candidate seen while building one step's trees, padded ``[B, P]``.

    Slot 0 of each request is its root. Policies mark the slots they keep; :meth:`compact` turns
    the kept slots into :class:`DraftTrees`. Kept sets must be ancestor-closed (checked by tests,
    guaranteed by every policy because a node is only proposed from a kept or frontier parent and
    path scores never increase along a path).
    """

    # Every field and its root column (slot 0 of each request).
    ROOT = dict(
        tokens=None,
        parent=-1,
        depth=0,
        logprob=0.0,
        score=0.0,
        drafter=0,
        proposal=DETERMINISTIC,
        valid=True,
        keep=True,
    )
    FIELDS = tuple(ROOT)
    _DTYPES = dict(logprob=torch.float32, score=torch.float32, valid=torch.bool, keep=torch.bool)

    def __init__(self, roots: Tensor, capacity: Optional[int] = None):
        """``capacity``: preallocate ``[B, capacity]`` columns, so appends write in place instead of
        concatenating (a fused kernel then writes a depth's columns itself, :meth:`reserve`)."""
        B, dev = roots.numel(), roots.device
        self.batch_size = B
        self._preallocated = capacity is not None
        # Columns past the root are written by append/reserve's caller before they are viewed.
        self._store = {
            f: torch.empty(B, capacity or 1, dtype=self._DTYPES.get(f, torch.int64), device=dev) for f in self.FIELDS
        }
        for f, value in self.ROOT.items():
            self._store[f][:, 0] = roots.reshape(B) if value is None else value
        self._view(1)
        self._dists: list[Tensor] = []
        self._num_dists = 0

    def _view(self, size: int) -> None:
        for f in self.FIELDS:
            setattr(self, f, self._store[f][:, :size])

    def reserve(self, columns: int) -> int:
        """Extend a preallocated pool by ``columns`` slots (their contents are the caller's to
        write: every field, ``keep`` included); returns the first new slot."""
        start = self.size
        if not self._preallocated or start + columns > self._store["tokens"].shape[1]:
            raise ValueError(f"reserve({columns}) needs a pool preallocated with capacity >= {start + columns}")
        self._view(start + columns)
        return start

    @property
    def size(self) -> int:
        return self.tokens.shape[1]

    def append(self, cands: Candidates, frontier: Tensor, depth: int) -> Tensor:
        """Append one depth of candidates; returns their pool slots ``[B, C]``.

        ``frontier[b, f]`` is the pool slot of frontier node ``f`` of request ``b``. Path scores
        follow Eq. 5: S_{i,d,j} = S_{i,d-1,pa(j)} + log q(x_{i,d,j} | h_{i,d-1,pa(j)}).
        """
        B, C = cands.tokens.shape
        parent_slot = frontier.gather(1, cands.parent.clamp(min=0))
        valid = cands.valid & (parent_slot >= 0)
        parent_slot = torch.where(valid, parent_slot, 0)
        score = self.score.gather(1, parent_slot) + cands.logprob
        score = torch.where(valid, score, float("-inf"))
        proposal = cands.proposal if cands.proposal is not None else torch.full_like(cands.tokens, DETERMINISTIC)
        if cands.proposal_dists is not None:
            proposal = torch.where(proposal >= 0, proposal + self._num_dists, proposal)
            self._dists.append(cands.proposal_dists)
            self._num_dists += cands.proposal_dists.shape[0]
        drafter = cands.drafter if cands.drafter is not None else torch.zeros_like(cands.tokens)
        new = dict(
            tokens=cands.tokens.long(),
            parent=parent_slot,
            depth=torch.full_like(cands.tokens, depth, dtype=torch.int64),
            logprob=cands.logprob.float(),
            score=score.float(),
            drafter=drafter.long(),
            proposal=proposal.long(),
            valid=valid,
            keep=torch.zeros_like(valid),
        )
        if self._preallocated:
            start = self.reserve(C)
            for f, value in new.items():
                getattr(self, f)[:, start:] = value
        else:
            start = self.size
            for f, value in new.items():
                setattr(self, f, torch.cat([getattr(self, f), value], 1))
        return torch.arange(start, start + C, device=self.tokens.device).expand(B, C)

    def newest(self, values: Tensor, slots: Tensor) -> Tensor:
        """``values`` (a pool field) at the slots :meth:`append` just returned: its last columns,
        a view (``values.gather(1, slots)`` would be a kernel)."""
        return values[:, values.shape[1] - slots.shape[1] :]

    def mark(self, slots: Tensor, mask: Tensor) -> None:
        """Keep ``slots[b, k]`` wherever ``mask[b, k]`` (slots < 0 are ignored)."""
        hits = (mask & (slots >= 0)).long()
        keep = self.keep.long().scatter_add_(1, slots.clamp(min=0), hits) > 0
        if self._preallocated:
            self.keep.copy_(keep)
        else:
            self.keep = keep

    def compact(self) -> DraftTrees:
        """Gather the kept slots into CSR :class:`DraftTrees`, re-indexing parents locally."""
        keep = self.keep & self.valid
        local = keep.long().cumsum(1) - 1  # new local index of every kept slot
        parent_local = torch.where(self.parent >= 0, local.gather(1, self.parent.clamp(min=0)), self.parent)
        counts = keep.sum(1)
        indptr = torch.zeros(self.batch_size + 1, dtype=torch.int64, device=keep.device)
        indptr[1:] = counts.cumsum(0)
        dists = torch.cat(self._dists, 0) if self._dists else None
        kept = keep.flatten().nonzero().squeeze(1)  # the step's one data-dependent size (one host sync)
        take = lambda t: t.flatten()[kept]  # noqa: E731
        return DraftTrees(
            indptr=indptr,
            tokens=take(self.tokens),
            parents=take(parent_local),
            depth=take(self.depth),
            logprob=take(self.logprob),
            path_score=take(self.score),
            drafter=take(self.drafter),
            proposal=take(self.proposal),
            proposal_dists=dists,
        )
