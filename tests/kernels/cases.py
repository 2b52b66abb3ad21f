"""Random ragged verify batches and a naive dense-mask oracle shared by the kernel tests."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import Tensor

from sglang_echo.core import DraftTrees, pack
from sglang_echo.kernels.bench import VerifyBatch

from ..core.trees import random_trees


@dataclass
class Case(VerifyBatch):
    """One verify step (the kernel contract) plus the trees and prefix lengths it came from."""

    trees: DraftTrees
    prefix_lens: list[int]


def empty_request_trees(trees: DraftTrees, where: list[int]) -> DraftTrees:
    """Insert requests with zero tree tokens before the given request indices."""
    sizes = trees.sizes.tolist()
    for i in sorted(where, reverse=True):
        sizes.insert(min(i, len(sizes)), 0)
    indptr = torch.tensor([0] + sizes).cumsum(0)
    return DraftTrees(
        indptr=indptr,
        tokens=trees.tokens,
        parents=trees.parents,
        depth=trees.depth,
        logprob=trees.logprob,
        path_score=trees.path_score,
        drafter=trees.drafter,
        proposal=trees.proposal,
    )


def make_case(
    seed: int,
    batch: int,
    max_nodes: int,
    max_prefix: int,
    hq: int,
    hkv: int,
    d: int,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    min_prefix: int = 0,
    empty_requests: int = 0,
    width: int | None = None,
) -> Case:
    """Random ragged trees over a shuffled slot-indexed cache (prefix and tree slots interleaved)."""
    rng = random.Random(seed)
    trees = random_trees(rng, batch, max_nodes, vocab=50)
    if empty_requests:
        trees = empty_request_trees(trees, [rng.randrange(batch + 1) for _ in range(empty_requests)])
    b = trees.batch_size
    prefix = [rng.randint(min_prefix, max_prefix) for _ in range(b)]
    n = trees.num_nodes
    total = sum(prefix) + n
    g = torch.Generator().manual_seed(seed)
    slots = torch.randperm(total + 7, generator=g)[:total] + 1  # slot 0 stays a spare
    s = total + 8
    packed = pack(trees, torch.tensor(prefix, dtype=torch.int64), width=width)
    kv_indptr = torch.tensor([0] + prefix).cumsum(0).to(torch.int32)
    q = torch.randn(n, hq, d, generator=g)
    k_cache = torch.randn(s, hkv, d, generator=g)
    v_cache = torch.randn(s, hkv, d, generator=g)
    return Case(
        trees=trees,
        prefix_lens=prefix,
        q=q.to(device=device, dtype=dtype),
        k_cache=k_cache.to(device=device, dtype=dtype),
        v_cache=v_cache.to(device=device, dtype=dtype),
        qo_indptr=packed.qo_indptr.to(device=device, dtype=torch.int32),
        kv_indptr=kv_indptr.to(device),
        kv_indices=slots[: sum(prefix)].to(device=device, dtype=torch.int32),
        tree_slots=slots[sum(prefix) :].to(device=device, dtype=torch.int32),
        packed_mask=packed.packed_mask.to(device),
        positions=packed.positions.to(device),
        sm_scale=d**-0.5,
    )


def naive_attention(case: Case) -> Tensor:
    """Per-request float64 attention with an explicit dense mask built from the tree parents
    (independent of the packed layout under test)."""
    q, kc, vc = case.q.double().cpu(), case.k_cache.double().cpu(), case.v_cache.double().cpu()
    n, hq, d = q.shape
    g = hq // kc.shape[1]
    out = torch.zeros(n, hq, d, dtype=torch.float64)
    kv_indices, tree_slots = case.kv_indices.long().cpu(), case.tree_slots.long().cpu()
    indptr = case.trees.indptr.tolist()
    kv_off = 0
    for i in range(case.trees.batch_size):
        lo, hi = indptr[i], indptr[i + 1]
        p = case.prefix_lens[i]
        slots = torch.cat([kv_indices[kv_off : kv_off + p], tree_slots[lo:hi]])
        kv_off += p
        if hi == lo:
            continue
        parents = case.trees.parents[lo:hi].tolist()
        dense = torch.zeros(hi - lo, p + hi - lo, dtype=torch.bool)
        dense[:, :p] = True
        for j in range(hi - lo):
            a = j
            while a >= 0:
                dense[j, p + a] = True
                a = parents[a]
        k = kc[slots].repeat_interleave(g, 1)  # [L, Hq, D]
        v = vc[slots].repeat_interleave(g, 1)
        s = torch.einsum("nhd,lhd->hnl", q[lo:hi], k) * case.sm_scale
        s = s.masked_fill(~dense, float("-inf"))
        out[lo:hi] = torch.einsum("hnl,lhd->nhd", s.softmax(-1), v)
    return out
