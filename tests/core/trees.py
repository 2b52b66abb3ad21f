"""Random draft trees and naive references shared by the core tests."""

from __future__ import annotations

import random

import torch

from sglang_echo.core import DETERMINISTIC, DraftTrees


def random_trees(
    rng: random.Random, batch: int, max_nodes: int, vocab: int, distinct_siblings: bool = True
) -> DraftTrees:
    """Random ragged trees: node j > 0 of a request hangs under a random earlier node."""
    sizes = [rng.randint(1, max_nodes) for _ in range(batch)]
    tokens, parents, depth = [], [], []
    for n in sizes:
        par, dep, tok = [-1], [0], [rng.randrange(vocab)]
        used: dict[int, set] = {}
        for j in range(1, n):
            p = rng.randrange(j)
            choices = [t for t in range(vocab) if not distinct_siblings or t not in used.get(p, set())]
            if not choices:  # the parent is full: hang the node under the root's first child chain
                p, choices = j - 1, list(range(vocab))
            t = rng.choice(choices)
            used.setdefault(p, set()).add(t)
            par.append(p)
            dep.append(dep[p] + 1)
            tok.append(t)
        tokens += tok
        parents += par
        depth += dep
    indptr = torch.tensor([0] + sizes).cumsum(0)
    n = len(tokens)
    return DraftTrees(
        indptr=indptr,
        tokens=torch.tensor(tokens),
        parents=torch.tensor(parents),
        depth=torch.tensor(depth),
        logprob=torch.zeros(n),
        path_score=torch.zeros(n),
        drafter=torch.zeros(n, dtype=torch.int64),
        proposal=torch.full((n,), DETERMINISTIC),
    )


def request_lists(trees: DraftTrees, i: int) -> tuple[list[int], list[int], list[int]]:
    lo, hi = int(trees.indptr[i]), int(trees.indptr[i + 1])
    return trees.tokens[lo:hi].tolist(), trees.parents[lo:hi].tolist(), trees.depth[lo:hi].tolist()


def assert_well_formed(trees: DraftTrees) -> None:
    """Roots first, parents earlier in the same request (ancestor-closed, topological)."""
    for i in range(trees.batch_size):
        _, parents, depth = request_lists(trees, i)
        assert parents and parents[0] == -1 and depth[0] == 0, "every request keeps its root"
        for j in range(1, len(parents)):
            assert 0 <= parents[j] < j, f"request {i} node {j}: parent {parents[j]} not an earlier node"
            assert depth[j] == depth[parents[j]] + 1
