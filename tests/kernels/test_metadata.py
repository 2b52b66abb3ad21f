"""Sync-free metadata builders against the core packer and plain loops."""

from __future__ import annotations

import random

import torch

from sglang_echo.core import pack
from sglang_echo.kernels.tree_attention.metadata import (
    block_capacity,
    build_block_table,
    gather_kv_indices,
    pack_dense_blocks,
    pack_full_mask_rows,
    unpack_bits,
)

from ..core.trees import random_trees
from .cases import empty_request_trees


def test_gather_kv_indices_matches_loop():
    req_to_token = torch.arange(5 * 50).reshape(5, 50).flip(1)
    pool = torch.tensor([3, 0, 4])
    lens = torch.tensor([7, 0, 12])
    indptr, idx = gather_kv_indices(req_to_token, pool, lens, capacity=25)
    assert indptr.tolist() == [0, 7, 7, 19]
    want = torch.cat([req_to_token[3, :7], req_to_token[4, :12]])
    assert idx[:19].tolist() == want.tolist() and (idx[19:] == 0).all()


def test_pack_dense_blocks_matches_core_pack():
    trees = random_trees(random.Random(1), 5, 45, vocab=60)
    packed = pack(trees, torch.zeros(5, dtype=torch.int64), width=64)
    got = pack_dense_blocks(packed.tree_mask, packed.mask_indptr, packed.qo_indptr, trees.num_nodes, 64)
    assert torch.equal(got, packed.packed_mask)
    assert torch.equal(unpack_bits(got, 64), packed.padded.mask[packed.padded.valid])


def test_pack_full_mask_rows_matches_core_pack():
    # sglang's FULL_MASK: per request n rows of (prefix + n), prefix columns set.
    n, prefix = 4, [3, 0, 5]
    rng = random.Random(2)
    trees = random_trees(rng, 3, n, vocab=9)
    while set(trees.sizes.tolist()) != {n}:
        trees = random_trees(rng, 3, n, vocab=9)
    packed = pack(trees, torch.tensor(prefix))
    chunks = []
    for i, p in enumerate(prefix):
        block = packed.padded.mask[i, :n, :n]
        chunks.append(torch.cat([torch.ones(n, p, dtype=torch.bool), block], 1).flatten())
    got = pack_full_mask_rows(torch.cat(chunks), torch.tensor(prefix), n)
    assert torch.equal(got, packed.packed_mask)


def test_block_table_covers_each_token_once():
    trees = empty_request_trees(random_trees(random.Random(3), 6, 30, vocab=40), [0, 3])
    qo = trees.indptr.to(torch.int32)
    n, bm = trees.num_nodes, 4
    req, start = build_block_table(qo, n, bm)
    assert req.numel() == block_capacity(n, trees.batch_size, bm)
    seen = torch.zeros(n, dtype=torch.int64)
    for r, s in zip(req.tolist(), start.tolist()):
        if r < 0:
            continue
        hi = min(s + bm, int(qo[r + 1]))
        assert int(qo[r]) <= s < hi
        seen[s:hi] += 1
    assert (seen == 1).all()
