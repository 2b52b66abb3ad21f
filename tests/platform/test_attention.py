"""`echo_torch` attention math vs a naive per-query softmax with an explicit dense mask.

No server: the paged gather + mask builders are exercised directly, with KV slots scattered
randomly through a pool the way sglang's allocator leaves them.
"""

from __future__ import annotations

import math

import pytest
import torch

from sglang_echo.platform.attention.draft import build_draft_decode_metadata, draft_lane_metadata, lane_rows_metadata
from sglang_echo.platform.attention.paged_sdpa import causal_mask, paged_sdpa, tree_mask
from tests.platform.test_ops import _random_tree_mask

H, HKV, D, POOL = 4, 2, 16, 512


def _naive(q, kb, vb, slots_per_req, visible_per_req, scale):
    """One query at a time: softmax over the keys its dense mask allows."""
    out, t = [], 0
    for slots, vis in zip(slots_per_req, visible_per_req):
        for i in range(vis.shape[0]):
            keys = slots[vis[i]]
            for h in range(H):
                kh = h // (H // HKV)
                s = (kb[keys, kh] @ q[t, h]) * scale
                out.append((torch.softmax(s, 0)[:, None] * vb[keys, kh]).sum(0))
            t += 1
    return torch.stack(out).view(-1, H, D)


def _setup(g, prefix, n):
    bs = len(prefix)
    kb, vb = torch.randn(POOL, HKV, D, generator=g), torch.randn(POOL, HKV, D, generator=g)
    r2t = torch.randperm(POOL, generator=g)[: bs * 64].view(bs, 64).to(torch.int32)
    req = torch.randperm(bs, generator=g)
    q = torch.randn(bs * n, H, D, generator=g)
    return kb, vb, r2t, req, q


@pytest.mark.parametrize("layout", ["qlen_only", "full"])
@pytest.mark.parametrize("seed", range(4))
def test_target_verify_tree_mask(seed: int, layout: str) -> None:
    g = torch.Generator().manual_seed(seed)
    prefix, n = torch.tensor([5, 1, 12]), 6
    bs = len(prefix)
    kb, vb, r2t, req, q = _setup(g, prefix, n)
    anc = _random_tree_mask(g, bs, n)  # [b, i, j]: draft j visible to draft i
    if layout == "qlen_only":
        custom = anc.reshape(-1)
    else:
        custom = torch.cat(
            [torch.cat([torch.ones(n, int(p), dtype=torch.bool), anc[b]], 1).reshape(-1) for b, p in enumerate(prefix)]
        )
    kv_lens = prefix + n
    vis = tree_mask(custom, prefix, n, int(kv_lens.max()))
    got = paged_sdpa(q, kb, vb, r2t, req, torch.full((bs,), n), kv_lens, vis, 1 / math.sqrt(D))

    slots, dense = [], []
    for b in range(bs):
        p = int(prefix[b])
        m = torch.zeros(n, p + n, dtype=torch.bool)
        m[:, :p] = True
        m[:, p:] = anc[b]
        slots.append(r2t[req[b], : p + n].long())
        dense.append(m)
    want = _naive(q, kb, vb, slots, dense, 1 / math.sqrt(D))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_extend_causal_ragged() -> None:
    g = torch.Generator().manual_seed(0)
    prefix, q_lens = torch.tensor([3, 0, 7]), torch.tensor([4, 2, 1])
    kv_lens = prefix + q_lens
    bs = 3
    kb, vb, r2t, req, _ = _setup(g, prefix, 1)
    q = torch.randn(int(q_lens.sum()), H, D, generator=g)
    vis = causal_mask(q_lens, kv_lens, int(q_lens.max()), int(kv_lens.max()))
    got = paged_sdpa(q, kb, vb, r2t, req, q_lens, kv_lens, vis, 0.3)
    slots = [r2t[req[b], : int(kv_lens[b])].long() for b in range(bs)]
    dense = [torch.ones(int(q_lens[b]), int(kv_lens[b]), dtype=torch.bool).tril(int(prefix[b])) for b in range(bs)]
    torch.testing.assert_close(got, _naive(q, kb, vb, slots, dense, 0.3), rtol=1e-4, atol=1e-5)


def test_draft_decode_metadata_layout() -> None:
    r2t = torch.arange(4 * 40).view(4, 40)
    seq, req, topk, steps = torch.tensor([3, 5]), torch.tensor([2, 0]), 2, 3
    table = build_draft_decode_metadata(r2t, req, seq, topk, steps)
    for b in range(2):
        for k in range(topk):
            s = int(seq[b])
            row = table[b * topk + k, : s + steps]
            want = torch.cat([r2t[req[b], :s], r2t[req[b], s + k * steps : s + (k + 1) * steps]])
            assert torch.equal(row, want)


@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("step", range(3))
def test_draft_lanes_as_queries_equal_one_row_per_lane(step: int, window) -> None:
    """Each request's lanes attended as queries over its one KV row give every lane the output
    of its own causal row (the prefix, then its own first step + 1 draft slots)."""
    g = torch.Generator().manual_seed(step)
    seq, topk, steps = torch.tensor([5, 1, 12]), 4, 3
    kb, vb, r2t, req, q = _setup(g, seq, topk)
    rows = lane_rows_metadata(build_draft_decode_metadata(r2t, req, seq, topk, steps), seq, topk, step)
    lanes = draft_lane_metadata(r2t, req, seq, topk, steps, step)
    row_mask = causal_mask(rows.q_lens, rows.kv_lens, 1, int(rows.kv_lens.max()), window)
    want = paged_sdpa(q, kb, vb, rows.req_to_token, rows.req_pool_indices, rows.q_lens, rows.kv_lens, row_mask, 0.3)
    got = paged_sdpa(q, kb, vb, r2t, req, lanes.q_lens, lanes.kv_lens, lanes.window_mask(window), 0.3)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert int(lanes.visible.sum()) == topk * int((seq + step + 1).sum())  # nothing else is seen
