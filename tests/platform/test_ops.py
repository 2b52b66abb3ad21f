"""Each pure-torch sgl_kernel op vs its loop-based reference on random inputs."""

from __future__ import annotations

import pytest
import torch

from sglang_echo.platform import ops
from tests.platform import naive_refs as ref

SEEDS = range(6)


def _pool(g: torch.Generator, reqs: int = 8, pool_len: int = 64) -> torch.Tensor:
    return torch.randint(0, 10_000, (reqs, pool_len), generator=g, dtype=torch.int32)


def _ends(g: torch.Generator, start: torch.Tensor, width) -> torch.Tensor:
    """Ragged ranges (width None), or all of one width (every decode / plain verify step: the ops' fast path)."""
    if width is None:
        return start + torch.randint(0, 20, start.shape, generator=g)
    return start + width


WIDTHS = [None, 0, 1, 3]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("seed", SEEDS)
def test_assign_req_to_token_pool(seed: int, width) -> None:
    g = torch.Generator().manual_seed(seed)
    r2t = _pool(g)
    bs = 5
    req = torch.randperm(8, generator=g)[:bs]
    start = torch.randint(0, 30, (bs,), generator=g)
    end = _ends(g, start, width)
    loc = torch.randint(0, 9999, (int((end - start).sum()),), generator=g)
    a, b = r2t.clone(), r2t.clone()
    ops.assign_req_to_token_pool_cpu(req, a, start, end, loc, a.shape[1])
    ref.assign_req_to_token_pool(req, b, start, end, loc)
    assert torch.equal(a, b)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("seed", SEEDS)
def test_assign_extend_cache_locs(seed: int, width) -> None:
    g = torch.Generator().manual_seed(seed)
    r2t = _pool(g)
    bs = 4
    req = torch.randperm(8, generator=g)[:bs]
    start = torch.randint(0, 30, (bs,), generator=g)
    end = _ends(g, start, width)
    a = torch.full((int((end - start).sum()) + 3,), -7, dtype=torch.int64)
    b = a.clone()
    ops.assign_extend_cache_locs_cpu(req, r2t, start, end, a, r2t.shape[1])
    ref.assign_extend_cache_locs(req, r2t, start, end, b)
    assert torch.equal(a, b)


@pytest.mark.parametrize("seed", SEEDS)
def test_assign_draft_cache_locs_contiguous(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    r2t = _pool(g)
    bs, topk, steps = 3, 2, 3
    req = torch.randperm(8, generator=g)[:bs]
    seq = torch.randint(1, 40, (bs,), generator=g)
    a = torch.zeros(bs * topk * steps, dtype=torch.int64)
    b = a.clone()
    ops.assign_draft_cache_locs_contiguous_cpu(req, r2t, seq, a, r2t.shape[1], topk, steps)
    ref.assign_draft_cache_locs_contiguous(req, r2t, seq, b, topk, steps)
    assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copy_all_layer_kv_cache(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    bufs = [torch.randn(50, 2, 8, generator=g).to(dtype) for _ in range(3)]
    expect = [x.clone() for x in bufs]
    # Overlapping (7 and 8 are both read and written), in place (5 -> 5, as every verified root)
    # and the padding pairs 0 -> 0 that sglang's move_accept_tokens_to_target_kvcache appends.
    tgt = torch.tensor([3, 7, 8, 20, 5, 0, 0])
    src = torch.tensor([7, 8, 40, 3, 5, 0, 0])
    for e in expect:
        e[tgt] = e[src].clone()
    ptrs = torch.tensor([x.data_ptr() for x in bufs], dtype=torch.int64)
    strides = torch.tensor([x[0].numel() * x.element_size() for x in bufs], dtype=torch.int64)
    ops.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for x, e in zip(bufs, expect):
        assert torch.equal(x, e)
    before = [x.clone() for x in bufs]
    ops.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([4, 0]), torch.tensor([4, 0]))  # nothing moves
    assert all(torch.equal(x, b) for x, b in zip(bufs, before))


@pytest.mark.parametrize("seed", SEEDS)
def test_fill_bonus_tokens(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    bs, stride = 5, 4
    toks = torch.randint(0, 100, (bs, stride), generator=g)
    lens = torch.randint(1, stride + 1, (bs,), generator=g)
    a, b = torch.zeros(bs, dtype=torch.int64), torch.zeros(bs, dtype=torch.int64)
    ops.fill_bonus_tokens_cpu(toks, lens, a, stride)
    ref.fill_bonus_tokens(toks, lens, b, stride)
    assert torch.equal(a, b)


@pytest.mark.parametrize("seed", SEEDS)
def test_fill_accept_out_cache_loc(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 24, (4, 6), generator=g)
    idx[torch.rand(4, 6, generator=g) < 0.4] = -1
    loc = torch.randint(0, 999, (24,), generator=g)
    a, b = torch.full((24,), -5), torch.full((24,), -5)
    ops.fill_accept_out_cache_loc_cpu(idx, loc, a)
    ref.fill_accept_out_cache_loc(idx, loc, b)
    assert torch.equal(a, b)


def _random_tree_mask(g: torch.Generator, bs: int, n: int) -> torch.Tensor:
    """Ancestor masks of random trees (node i's parent is a random earlier node)."""
    m = torch.zeros(bs, n, n, dtype=torch.bool)
    for b in range(bs):
        for i in range(n):
            m[b, i, i] = True
            if i:
                p = int(torch.randint(0, i, (1,), generator=g))
                m[b, i] |= m[b, p]
    return m


@pytest.mark.parametrize("seed", SEEDS)
def test_reconstruct_indices_from_tree_mask(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    bs, n = 3, 7
    mask = _random_tree_mask(g, bs, n).reshape(-1)
    seq = torch.randint(1, 50, (bs,), generator=g)
    outs = [[torch.full((bs * n,), -9, dtype=torch.int64) for _ in range(4)] for _ in range(2)]
    ops.reconstruct_indices_from_tree_mask(mask, seq, *outs[0], bs, n)
    ref.reconstruct(mask, seq, *outs[1], bs, n)
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def _eagle_tree_inputs(g: torch.Generator, bs: int, topk: int, depth: int, n: int):
    """Random (parent_list, selected_index) shaped like sglang's EAGLE draft outputs."""
    plen = topk * (depth - 1) + 1
    sel_space = topk + (depth - 1) * topk * topk
    sel = torch.stack([torch.sort(torch.randperm(sel_space, generator=g)[: n - 1]).values for _ in range(bs)])
    parent_list = torch.randint(-1, sel_space, (bs, plen), generator=g)
    # Make most parents real nodes so trees are deep.
    for b in range(bs):
        for j in range(1, plen):
            if torch.rand(1, generator=g) < 0.8:
                parent_list[b, j] = sel[b, int(torch.randint(0, n - 1, (1,), generator=g))]
    return parent_list, sel


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", [0, 1])
def test_build_tree_kernel_efficient(seed: int, mode: int) -> None:
    g = torch.Generator().manual_seed(seed)
    bs, topk, depth, n = 3, 2, 4, 7
    parent_list, sel = _eagle_tree_inputs(g, bs, topk, depth, n)
    seq = torch.randint(1, 9, (bs,), generator=g)
    size = int(seq.sum()) * n + bs * n * n if mode == 0 else bs * n * n
    res = []
    for fn in (ops.build_tree_kernel_efficient_cpu, None):
        mask = torch.ones(size, dtype=torch.bool)
        pos = torch.zeros(bs * n, dtype=torch.int64)
        ridx, rnext, rsib = (torch.full((bs * n,), -1, dtype=torch.int64) for _ in range(3))
        if fn is None:
            ref.build_tree(parent_list, sel, seq, mask, pos, ridx, rnext, rsib, topk, depth, n, mode)
        else:
            fn(
                parent_list,
                sel,
                seq,
                mask,
                pos,
                ridx.view(bs, n),
                rnext.view(bs, n),
                rsib.view(bs, n),
                topk,
                depth,
                n,
                mode,
            )
        res.append((mask, pos, ridx, rnext, rsib))
    for a, b in zip(*res):
        assert torch.equal(a, b)


@pytest.mark.parametrize("num_spec", [5, 1])  # 1: a plain step's verify, roots only
@pytest.mark.parametrize("seed", SEEDS)
def test_verify_tree_greedy(seed: int, num_spec: int) -> None:
    g = torch.Generator().manual_seed(seed)
    bs, n, vocab = 4, 8, 3  # tiny vocab: many matches, duplicate siblings
    mask = _random_tree_mask(g, bs, n).reshape(-1)
    ridx, rnext, rsib, pos = (torch.zeros(bs * n, dtype=torch.int64) for _ in range(4))
    ops.reconstruct_indices_from_tree_mask(mask, torch.zeros(bs, dtype=torch.int64), pos, ridx, rnext, rsib, bs, n)
    ridx, rnext, rsib = ridx.view(bs, n), rnext.view(bs, n), rsib.view(bs, n)
    cand = torch.randint(0, vocab, (bs, n), generator=g)
    target = torch.randint(0, vocab, (bs, n), generator=g)
    res = []
    for fn in (ops.verify_tree_greedy_cpu, ref.verify_tree_greedy):
        predicts = torch.full((bs * n,), -3, dtype=torch.int32)
        acc_idx = torch.full((bs, num_spec), -1, dtype=torch.int32)
        acc_num = torch.zeros(bs, dtype=torch.int32)
        fn(predicts, acc_idx, acc_num, cand, ridx, rnext, rsib, target)
        res.append((predicts, acc_idx, acc_num))
    for a, b in zip(*res):
        assert torch.equal(a, b)


def _shuffled_links(g: torch.Generator, bs: int, n: int):
    """retrive_* linked lists of random trees whose sibling lists are in RANDOM order
    (EAGLE's builder emits increasing order; the verifier must follow the list, not the ids)."""
    nxt = torch.full((bs, n), -1, dtype=torch.int64)
    sib = torch.full((bs, n), -1, dtype=torch.int64)
    for b in range(bs):
        kids: dict[int, list[int]] = {}
        for i in range(1, n):
            kids.setdefault(int(torch.randint(0, i, (1,), generator=g)), []).append(i)
        for p, ks in kids.items():
            ks = [ks[j] for j in torch.randperm(len(ks), generator=g).tolist()]
            nxt[b, p] = ks[0]
            for a, c in zip(ks, ks[1:]):
                sib[b, a] = c
    ridx = torch.arange(bs * n).view(bs, n)
    return ridx, nxt, sib


@pytest.mark.parametrize("seed", SEEDS)
def test_verify_tree_greedy_follows_sibling_order(seed: int) -> None:
    g = torch.Generator().manual_seed(100 + seed)
    bs, n, num_spec, vocab = 3, 10, 6, 2
    ridx, rnext, rsib = _shuffled_links(g, bs, n)
    cand = torch.randint(0, vocab, (bs, n), generator=g)
    target = torch.randint(0, vocab, (bs, n), generator=g)
    res = []
    for fn in (ops.verify_tree_greedy_cpu, ref.verify_tree_greedy):
        predicts = torch.full((bs * n,), -3, dtype=torch.int64)
        acc_idx = torch.full((bs, num_spec), -1, dtype=torch.int64)
        acc_num = torch.zeros(bs, dtype=torch.int64)
        fn(predicts, acc_idx, acc_num, cand, ridx, rnext, rsib, target)
        res.append((predicts, acc_idx, acc_num))
    for a, b in zip(*res):
        assert torch.equal(a, b)
