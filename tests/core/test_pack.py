"""Flatten & pack against a naive per-request reference."""

import random

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_echo.core import pack

from .trees import random_trees, request_lists


def naive_layout(trees, prefix_lens):
    positions, masks, first_child, next_sibling = [], [], [], []
    for i in range(trees.batch_size):
        _, parents, depth = request_lists(trees, i)
        n = len(parents)
        positions += [int(prefix_lens[i]) + d for d in depth]
        mask = [[False] * n for _ in range(n)]
        for j in range(n):
            k = j
            while k >= 0:
                mask[j][k] = True
                k = parents[k]
        masks.append(mask)
        children = {j: [k for k in range(n) if parents[k] == j] for j in range(n)}
        first_child.append([children[j][0] if children[j] else -1 for j in range(n)])
        sib = [-1] * n
        for kids in children.values():
            for a, b in zip(kids, kids[1:]):
                sib[a] = b
        next_sibling.append(sib)
    return positions, masks, first_child, next_sibling


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), batch=st.integers(1, 9), max_nodes=st.integers(1, 140))  # up to 3 mask words
def test_pack_matches_naive_reference(seed, batch, max_nodes):
    rng = random.Random(seed)
    trees = random_trees(rng, batch, max_nodes, vocab=50)
    prefix = torch.tensor([rng.randint(0, 100) for _ in range(batch)])
    packed = pack(trees, prefix)
    positions, masks, first_child, next_sibling = naive_layout(trees, prefix)

    assert packed.qo_indptr.tolist() == trees.indptr.tolist()
    assert packed.positions.tolist() == positions
    flat = [b for m in masks for row in m for b in row]
    assert packed.tree_mask.tolist() == flat
    assert packed.mask_indptr.tolist() == [0] + list(torch.tensor([len(m) ** 2 for m in masks]).cumsum(0).tolist())
    W = packed.width
    for i, m in enumerate(masks):
        n = len(m)
        lo = int(trees.indptr[i])
        assert packed.retrieve_index[i, :n].tolist() == list(range(lo, lo + n))
        assert (packed.retrieve_index[i, n:] == -1).all()
        assert packed.retrieve_next_token[i, :n].tolist() == first_child[i]
        assert packed.retrieve_next_sibling[i, :n].tolist() == next_sibling[i]
        assert packed.padded.mask[i, :n, :n].tolist() == m
        assert not packed.padded.mask[i, n:].any() and not packed.padded.mask[i, :, n:].any()
        for j in range(n):  # bit k of word k // 32 of row j
            words = packed.packed_mask[lo + j].tolist()
            bits = [(words[k // 32] >> (k % 32)) & 1 == 1 for k in range(W)]
            assert bits == m[j] + [False] * (W - n)


def test_packed_mask_uses_bit_31_and_several_words():
    rng = random.Random(3)
    trees = random_trees(rng, 2, 70, vocab=200)
    packed = pack(trees, torch.zeros(2, dtype=torch.int64))
    assert packed.packed_mask.shape[1] == -(-packed.width // 32)
    # Unpack and compare with the dense mask, sign bit included.
    unpacked = ((packed.packed_mask[:, :, None].long() & 0xFFFFFFFF) >> torch.arange(32)) & 1
    dense = packed.padded.mask[packed.padded.valid]
    assert torch.equal(unpacked.flatten(1)[:, : packed.width].bool(), dense)


def test_fixed_width_padding_and_overflow():
    trees = random_trees(random.Random(0), 3, 5, vocab=20)
    packed = pack(trees, torch.zeros(3, dtype=torch.int64), width=8)
    assert packed.width == 8 and packed.padded.valid.sum() == trees.num_nodes
    try:
        pack(trees, torch.zeros(3, dtype=torch.int64), width=int(trees.sizes.max()) - 1)
    except ValueError as e:
        assert "padded width" in str(e)
    else:
        raise AssertionError("a tree wider than the padded width must be refused")
