"""ECHO's per-depth decision (Alg. 1) as one Triton program for the whole batch.

Eagerly, one depth of :class:`~sglang_echo.core.scheduler.ElasticPolicy` is about 60 tensor ops:
the pool append (Eq. 5), the confidence (Eq. 6), the gate (Eq. 7), a per-request sort, the
priority sort and prefix sum of the grants (Alg. 1 lines 5-15), top-k, marks and the truncation
record. On a GPU each is a launch of a tiny kernel, and even as CUDA graphs (or fused by Inductor)
the step stays at 1.4-2.6 ms (``benchmarks/results/gpu-h200/``). :func:`elastic_depth` does all of
it in one program, :func:`elastic_select` Priority 2 (lines 16-20) in another.

Why one program (one thread block) for the whole batch: the grants couple the requests (a prefix
sum in priority order), and a batch is at most a few hundred rows of a few candidates. Sorting
is replaced by counting, which gives the same order as the stable sorts of the eager code:

* a candidate's rank in its request is the number of candidates with a higher masked path score,
  or an equal one in an earlier column (``torch.sort(..., descending=True, stable=True)``);
* the budget a request sees is what the requests ahead of it want, ahead meaning a higher
  priority, or an equal one and a lower row (:func:`~sglang_echo.core.policy.grant_in_priority`).

The requests "ahead" are summed in chunks of rows that are recomputed from the inputs (never read
back from this program's own stores), so no barrier is needed and the batch size is free.

The pool must be preallocated (:class:`~sglang_echo.core.tree.NodePool` ``capacity``): the kernel
writes the depth's columns (every field) itself. Greedy candidates only (no proposal
distributions: :class:`ElasticPolicy` falls back to the eager path for those). Launches read only
device tensors and host constants, so they can be captured in CUDA graphs. On CPU it runs under
``TRITON_INTERPRET=1`` (tests); the layouts equal the eager policy's (``tests/kernels/test_control.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice

from ...core.tree import DETERMINISTIC, Candidates, NodePool
from .tiles import block

CHUNK = 32  # rows of the batch compared at once in the grant prefix sum
_DETERMINISTIC = tl.constexpr(DETERMINISTIC)


@triton.jit
def _candidates(
    rows,
    cols,
    B,
    C,
    cand_logprob,
    cand_parent,
    cand_valid,
    stride_c,
    frontier,
    stride_f,
    F,
    pool_score,
    stride_p,
    active,
):
    """Path scores (Eq. 5) and validity of the candidates ``[rows, cols]`` as the pool stores
    them, plus the decision mask (valid and the request active); recomputable for any rows."""
    inb = (rows[:, None] < B) & (cols[None, :] < C)
    par = tl.maximum(tl.load(cand_parent + rows[:, None] * stride_c + cols[None, :], mask=inb, other=0), 0)
    parent_slot = tl.load(frontier + rows[:, None] * stride_f + par, mask=inb & (par < F), other=-1)
    proposed = tl.load(cand_valid + rows[:, None] * stride_c + cols[None, :], mask=inb, other=0) != 0
    valid = proposed & (parent_slot >= 0)
    parent_slot = tl.where(valid, parent_slot, 0)
    parent_score = tl.load(pool_score + rows[:, None] * stride_p + parent_slot, mask=inb, other=0.0)
    logprob = tl.load(cand_logprob + rows[:, None] * stride_c + cols[None, :], mask=inb, other=0.0)
    score = tl.where(valid, parent_score + logprob, float("-inf"))
    is_active = tl.load(active + rows, mask=rows < B, other=0) != 0
    return score, valid, parent_slot, valid & is_active[:, None]


@triton.jit
def _gate(score, decide, tau, width, GATED: tl.constexpr, LIBDEVICE: tl.constexpr):
    """Eq. 6-7 and Priority 1's wants: (confidence, valid count, has candidates, passed, want,
    priority) per row; a request that fails or has nothing to draft wants 0, priority -1, one
    that passes at most ``width`` (the step's, ``<= W_DEF``)."""
    masked = tl.where(decide, score, float("-inf"))
    if LIBDEVICE:  # expf, as torch computes it: a GPU's tl.exp is the approximate ex2
        conf = libdevice.exp(tl.max(masked, 1))
    else:  # the CPU interpreter has no libdevice
        conf = tl.exp(tl.max(masked, 1))
    n_valid = tl.sum(decide.to(tl.int64), 1)
    has = n_valid > 0
    if GATED:
        passed = has & (conf >= tau)
    else:
        passed = has
    want = tl.where(passed, tl.minimum(n_valid, width), 0)
    return conf, n_valid, has, passed, want, tl.where(passed, conf, -1.0)


@triton.jit
def _ahead(rows, priority, rows_j, priority_j, want_j, B):
    """What the rows ``rows_j`` ahead of each row want: Alg. 1's "most confident first" order."""
    first = (priority_j[None, :] > priority[:, None]) | (
        (priority_j[None, :] == priority[:, None]) & (rows_j[None, :] < rows[:, None])
    )
    return tl.sum(tl.where(first & (rows_j[None, :] < B), want_j[None, :], 0), 1)


@triton.jit
def _column(rank, cols, k, C):
    """The column holding rank ``k`` in each row (0 where none)."""
    return tl.sum(tl.where((rank == k) & (cols[None, :] < C), cols[None, :], 0), 1)


@triton.jit
def _elastic_depth_kernel(
    cand_tokens,
    cand_logprob,
    cand_parent,
    cand_valid,
    cand_drafter,
    cand_proposal,
    stride_c,
    frontier,
    stride_f,
    F,
    pool_tokens,
    pool_parent,
    pool_depth,
    pool_logprob,
    pool_score,
    pool_drafter,
    pool_proposal,
    pool_valid,
    pool_keep,
    stride_p,
    active,
    budget,
    trunc_slots,
    trunc_conf,
    truncated,
    stride_t,
    gate_evaluated,
    gate_passed,
    out_frontier,
    out_source,
    out_tokens,
    out_score,
    out_active,
    out_budget,
    B,
    C,
    start,
    depth,
    tau,
    width,
    GATED: tl.constexpr,
    HAS_DRAFTER: tl.constexpr,
    HAS_PROPOSAL: tl.constexpr,
    W_DEF: tl.constexpr,
    W_MAX: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_C: tl.constexpr,
    CHUNK_B: tl.constexpr,
    LIBDEVICE: tl.constexpr,
):
    rows = tl.arange(0, BLOCK_B)
    cols = tl.arange(0, BLOCK_C)
    row_ok = rows < B
    inb = row_ok[:, None] & (cols[None, :] < C)
    args = (B, C, cand_logprob, cand_parent, cand_valid, stride_c, frontier, stride_f, F, pool_score, stride_p, active)
    score, valid, parent_slot, decide = _candidates(rows, cols, *args)

    # The pool append (NodePool.append): every field of the new columns.
    new = rows[:, None] * stride_p + start + cols[None, :]
    cand = rows[:, None] * stride_c + cols[None, :]
    tl.store(pool_tokens + new, tl.load(cand_tokens + cand, mask=inb, other=0), mask=inb)
    tl.store(pool_parent + new, parent_slot, mask=inb)
    tl.store(pool_depth + new, tl.zeros([BLOCK_B, BLOCK_C], tl.int64) + depth, mask=inb)
    tl.store(pool_logprob + new, tl.load(cand_logprob + cand, mask=inb, other=0.0), mask=inb)
    tl.store(pool_score + new, score, mask=inb)
    if HAS_DRAFTER:
        tl.store(pool_drafter + new, tl.load(cand_drafter + cand, mask=inb, other=0), mask=inb)
    else:
        tl.store(pool_drafter + new, tl.zeros([BLOCK_B, BLOCK_C], tl.int64), mask=inb)
    if HAS_PROPOSAL:
        tl.store(pool_proposal + new, tl.load(cand_proposal + cand, mask=inb, other=0), mask=inb)
    else:
        tl.store(pool_proposal + new, tl.zeros([BLOCK_B, BLOCK_C], tl.int64) + _DETERMINISTIC, mask=inb)
    tl.store(pool_valid + new, valid, mask=inb)

    conf, n_valid, has, passed, want, priority = _gate(score, decide, tau, width, GATED, LIBDEVICE)

    # Rank of each candidate in its request (the eager code's stable descending sort).
    masked = tl.where(decide, score, float("-inf"))
    rank = tl.zeros([BLOCK_B, BLOCK_C], tl.int32)
    for c in tl.static_range(BLOCK_C):
        other, other_valid, other_parent, other_decide = _candidates(rows, tl.full([1], c, tl.int32), *args)
        other = tl.where(other_decide, other, float("-inf"))
        first = (other > masked) | ((other == masked) & (c < cols[None, :]))
        rank += (first & (c < C)).to(tl.int32)

    # Priority 1 (Alg. 1 lines 5-15): grants in priority order within the budget.
    ahead = tl.zeros([BLOCK_B], tl.int64)
    for j0 in range(0, B, CHUNK_B):
        rows_j = j0 + tl.arange(0, CHUNK_B)
        score_j, valid_j, parent_j, decide_j = _candidates(rows_j, cols, *args)
        conf_j, n_valid_j, has_j, passed_j, want_j, priority_j = _gate(score_j, decide_j, tau, width, GATED, LIBDEVICE)
        ahead += _ahead(rows, priority, rows_j, priority_j, want_j, B)
    left = tl.load(budget)
    grant = tl.minimum(tl.maximum(left - ahead, 0), want)
    grant = tl.where(row_ok, grant, 0)
    left = left - tl.sum(grant, 0)
    tl.store(out_budget, left)
    tl.store(pool_keep + new, rank < grant[:, None], mask=inb)
    tl.store(out_active + rows, passed & (grant > 0) & (left > 0), mask=row_ok)
    for k in tl.static_range(W_DEF):  # the next frontier: slots, source columns, tokens, path scores
        col = _column(rank, cols, k, C)
        taken = k < grant
        out = rows * W_DEF + k
        tl.store(out_frontier + out, tl.where(taken, start + col, -1), mask=row_ok)
        tl.store(out_source + out, tl.where(taken, col, -1), mask=row_ok)
        token = tl.load(cand_tokens + rows * stride_c + col, mask=row_ok & taken, other=0)
        tl.store(out_tokens + out, token, mask=row_ok)
        ranked_score = tl.sum(tl.where((rank == k) & inb, score, 0.0), 1)  # the one rank-k score (+ zeros: exact)
        tl.store(out_score + out, tl.where(taken, ranked_score, float("-inf")), mask=row_ok)

    if GATED:  # truncation: remember the best W_max candidates for Priority 2
        failed = has & ~passed & row_ok
        best = tl.minimum(n_valid, W_MAX)
        for k in tl.static_range(W_MAX):
            slot = tl.where(k < best, start + _column(rank, cols, k, C), -1)
            tl.store(trunc_slots + rows * stride_t + k, slot, mask=failed)
        tl.store(trunc_conf + rows, conf, mask=failed)
        tl.store(truncated + rows, failed, mask=failed)
        evaluated = tl.sum((has & row_ok).to(tl.int64), 0)
        tl.store(gate_evaluated + depth, tl.load(gate_evaluated + depth) + evaluated)
        tl.store(gate_passed + depth, tl.load(gate_passed + depth) + tl.sum((passed & row_ok).to(tl.int64), 0))


@triton.jit
def _widen(rows, trunc_slots, trunc_conf, truncated, stride_t, B, W_MAX: tl.constexpr, BLOCK_W: tl.constexpr):
    """Priority 2's wants and priorities (Alg. 1 lines 16-20) for ``rows``."""
    ks = tl.arange(0, BLOCK_W)
    row_ok = rows < B
    slots = tl.load(
        trunc_slots + rows[:, None] * stride_t + ks[None, :], mask=row_ok[:, None] & (ks[None, :] < W_MAX), other=-1
    )
    is_truncated = tl.load(truncated + rows, mask=row_ok, other=0) != 0
    avail = tl.sum((slots >= 0).to(tl.int64), 1)
    want = tl.where(is_truncated, tl.minimum(avail, W_MAX), 0)
    priority = tl.where(is_truncated, tl.load(trunc_conf + rows, mask=row_ok, other=0.0), -1.0)
    return slots, want, priority


@triton.jit
def _elastic_select_kernel(
    trunc_slots,
    trunc_conf,
    truncated,
    stride_t,
    budget,
    pool_keep,
    stride_p,
    out_budget,
    out_widened,
    B,
    W_MAX: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_B: tl.constexpr,
    CHUNK_B: tl.constexpr,
):
    rows = tl.arange(0, BLOCK_B)
    row_ok = rows < B
    slots, want, priority = _widen(rows, trunc_slots, trunc_conf, truncated, stride_t, B, W_MAX, BLOCK_W)
    ahead = tl.zeros([BLOCK_B], tl.int64)
    for j0 in range(0, B, CHUNK_B):
        rows_j = j0 + tl.arange(0, CHUNK_B)
        slots_j, want_j, priority_j = _widen(rows_j, trunc_slots, trunc_conf, truncated, stride_t, B, W_MAX, BLOCK_W)
        ahead += _ahead(rows, priority, rows_j, priority_j, want_j, B)
    left = tl.load(budget)
    grant = tl.where(row_ok, tl.minimum(tl.maximum(left - ahead, 0), want), 0)
    tl.store(out_budget, left - tl.sum(grant, 0))
    tl.store(out_widened + rows, grant, mask=row_ok)
    ks = tl.arange(0, BLOCK_W)
    hit = row_ok[:, None] & (ks[None, :] < grant[:, None]) & (slots >= 0)
    tl.store(pool_keep + rows[:, None] * stride_p + tl.maximum(slots, 0), hit, mask=hit)


def elastic_depth(
    pool: NodePool,
    cands: Candidates,
    frontier: Tensor,
    active: Tensor,
    budget: Tensor,
    trunc: dict,
    gate_evaluated: Tensor,
    gate_passed: Tensor,
    *,
    depth: int,
    tau: float,
    gated: bool,
    w_def: int,
    w_max: int,
    width: int | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """One ECHO depth: append ``cands`` to ``pool`` (preallocated) and decide which enter the trees.

    Updates the pool, the truncation record ``trunc`` (``trunc_slots``, ``trunc_conf``,
    ``truncated``) and the gate counters in place; returns the next frontier's slots, source
    columns, tokens and path scores ``[B, W_def]``, the active requests ``[B]`` and the remaining
    budget (0-d). ``width``: the most candidates a passing request is granted (default ``w_def``;
    the frontier stays ``w_def`` wide).
    """
    if cands.proposal_dists is not None:
        raise ValueError("elastic_depth is greedy only: the candidates carry proposal distributions")
    B, C = cands.tokens.shape
    start = pool.reserve(C)
    dev = cands.tokens.device
    out_frontier = torch.empty(B, w_def, dtype=torch.int64, device=dev)
    out_source = torch.empty(B, w_def, dtype=torch.int64, device=dev)
    out_tokens = torch.empty(B, w_def, dtype=torch.int64, device=dev)
    out_score = torch.empty(B, w_def, dtype=torch.float32, device=dev)
    out_active = torch.empty(B, dtype=torch.bool, device=dev)
    out_budget = torch.empty((), dtype=torch.int64, device=dev)
    # Every candidate field [B, C] row-major (the builder's buffers already are: no copies there).
    tokens, logprob, parent, valid = (t.contiguous() for t in (cands.tokens, cands.logprob, cands.parent, cands.valid))
    drafter = tokens if cands.drafter is None else cands.drafter.contiguous()
    proposal = tokens if cands.proposal is None else cands.proposal.contiguous()
    frontier = frontier.contiguous()
    ts = trunc["trunc_slots"]
    p = [
        pool.tokens,
        pool.parent,
        pool.depth,
        pool.logprob,
        pool.score,
        pool.drafter,
        pool.proposal,
        pool.valid,
        pool.keep,
    ]
    _elastic_depth_kernel[(1,)](
        tokens,
        logprob,
        parent,
        valid,
        drafter,
        proposal,
        C,
        frontier,
        frontier.stride(0),
        frontier.shape[1],
        *p,
        pool.tokens.stride(0),
        active,
        budget,
        ts,
        trunc["trunc_conf"],
        trunc["truncated"],
        ts.stride(0),
        gate_evaluated,
        gate_passed,
        out_frontier,
        out_source,
        out_tokens,
        out_score,
        out_active,
        out_budget,
        B,
        C,
        start,
        depth,
        float(tau),
        w_def if width is None else min(width, w_def),
        GATED=gated,
        HAS_DRAFTER=cands.drafter is not None,
        HAS_PROPOSAL=cands.proposal is not None,
        W_DEF=w_def,
        W_MAX=w_max,
        BLOCK_B=block(B),
        BLOCK_C=block(C),
        CHUNK_B=min(CHUNK, block(B)),
        LIBDEVICE=dev.type == "cuda",
        num_warps=_warps(B),
    )
    return out_frontier, out_source, out_tokens, out_score, out_active, out_budget


def elastic_select(pool: NodePool, budget: Tensor, trunc: dict, w_max: int) -> tuple[Tensor, Tensor]:
    """Priority 2 (Alg. 1 lines 16-20): widen truncated requests, most confident first, with the
    budget left; marks the pool in place. Returns (budget left, grant per request)."""
    ts = trunc["trunc_slots"]
    B = ts.shape[0]
    out_budget = torch.empty((), dtype=torch.int64, device=ts.device)
    widened = torch.empty(B, dtype=torch.int64, device=ts.device)
    _elastic_select_kernel[(1,)](
        ts,
        trunc["trunc_conf"],
        trunc["truncated"],
        ts.stride(0),
        budget,
        pool.keep,
        pool.keep.stride(0),
        out_budget,
        widened,
        B,
        W_MAX=w_max,
        BLOCK_W=block(w_max),
        BLOCK_B=block(B),
        CHUNK_B=min(CHUNK, block(B)),
        num_warps=_warps(B),
    )
    return out_budget, widened


def _warps(batch: int) -> int:
    return 8 if batch <= 256 else 16  # no register spills up to batch 256 (sm_90, tests/kernels)
