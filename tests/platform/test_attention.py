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


class _Pool:
    """The draft KV pool's surface the backend uses: one layer of keys and values."""

    start_layer, layer_num = 0, 1

    def __init__(self, g):
        self.k, self.v = torch.randn(POOL, HKV, D, generator=g), torch.randn(POOL, HKV, D, generator=g)

    def get_key_buffer(self, layer_id):
        return self.k

    def get_value_buffer(self, layer_id):
        return self.v

    def set_kv_buffer(self, layer, loc, k, v):
        self.k[loc.loc], self.v[loc.loc] = k, v


@pytest.mark.parametrize("deterministic", [False, True])
def test_draft_steps_over_lane_subsets_equal_padded_lanes(deterministic: bool) -> None:
    """Draft steps that run only the frontier's lanes (1, then 3, then 2 of 4) give those lanes the
    outputs of the padded layout, where every lane runs and the lanes beyond the frontier are
    duplicates of lane 0 (what EAGLE's drafter feeds them)."""
    from types import SimpleNamespace

    from sglang_echo.platform.attention.draft import EchoTorchMultiStepDraftBackend

    g = torch.Generator().manual_seed(7)
    seq, topk, steps, lanes_run = torch.tensor([5, 1, 12]), 4, 4, [1, 3, 2]
    bs = len(seq)
    _, _, r2t, req, _ = _setup(g, seq, 1)
    pools = {name: _Pool(torch.Generator().manual_seed(1)) for name in ("padded", "subset")}
    layer = SimpleNamespace(
        layer_id=0, tp_q_head_num=H, qk_head_dim=D, v_head_dim=D, scaling=0.3, sliding_window_size=None,
        is_cross_attention=False, logit_cap=0,
    )  # fmt: skip
    backends = {}
    for name, pool in pools.items():
        runner = SimpleNamespace(
            device="cpu", req_to_token_pool=SimpleNamespace(req_to_token=r2t), token_to_kv_pool=pool
        )
        backends[name] = EchoTorchMultiStepDraftBackend(runner, topk, steps)
        for b in backends[name].attn_backends:
            b.deterministic = deterministic
        backends[name].init_forward_metadata(SimpleNamespace(seq_lens=seq, req_pool_indices=req))
    slots = torch.stack([r2t[req[b], int(seq[b]) :][: topk * steps].long().view(topk, steps) for b in range(bs)])
    for step, lanes in enumerate(lanes_run):
        q, k, v = (torch.randn(bs, lanes, H * D if i == 0 else HKV * D, generator=g) for i in range(3))

        def padded(t):  # lanes beyond the frontier: duplicates of lane 0
            return torch.cat([t, t[:, :1].expand(-1, topk - lanes, -1)], 1).reshape(bs * topk, -1)

        def rows(t):
            return t.reshape(bs * lanes, -1)

        out_p = backends["padded"].attn_backends[step].forward_decode(
            padded(q), padded(k).view(-1, HKV, D), padded(v).view(-1, HKV, D), layer,
            SimpleNamespace(out_cache_loc=slots[:, :, step].reshape(-1)),
        )  # fmt: skip
        backends["subset"].select_lanes(step, lanes)
        out_s = backends["subset"].attn_backends[step].forward_decode(
            rows(q), rows(k).view(-1, HKV, D), rows(v).view(-1, HKV, D), layer,
            SimpleNamespace(out_cache_loc=slots[:, :lanes, step].reshape(-1)),
        )  # fmt: skip
        want = out_p.view(bs, topk, -1)[:, :lanes]
        torch.testing.assert_close(out_s.view(bs, lanes, -1), want, rtol=1e-5, atol=1e-6)
    # Lane 1 ran from step 1 on: its step-0 slot now holds lane 0's keys, as the padded pool's does.
    assert torch.equal(pools["subset"].k[slots[:, 1, 0]], pools["padded"].k[slots[:, 1, 0]])


class _Layers:
    """A target KV pool of ``n`` layers (the surface the backend uses), keys and values at random."""

    def __init__(self, g, n):
        self.k = [torch.randn(POOL, HKV, D, generator=g) for _ in range(n)]
        self.v = [torch.randn(POOL, HKV, D, generator=g) for _ in range(n)]

    def get_key_buffer(self, layer_id):
        return self.k[layer_id]

    def get_value_buffer(self, layer_id):
        return self.v[layer_id]


def _paged_backend(r2t, pool):
    """The ``echo_torch`` backend over ``pool``, its padded SDPA path (not the deterministic one)."""
    from types import SimpleNamespace

    from sglang_echo.platform.attention.backend import EchoTorchAttnBackend

    runner = SimpleNamespace(device="cpu", req_to_token_pool=SimpleNamespace(req_to_token=r2t), token_to_kv_pool=pool)
    backend = EchoTorchAttnBackend(runner)
    backend.deterministic = False
    return backend


def _layer(i):
    """An unwindowed self-attention layer ``i`` of the test's shape (what the backend reads of one)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        layer_id=i, tp_q_head_num=H, qk_head_dim=D, v_head_dim=D, scaling=0.3, sliding_window_size=None,
        is_cross_attention=False, logit_cap=0,
    )  # fmt: skip


def test_a_forward_shares_its_paged_batch_across_layers_and_the_next_builds_its_own() -> None:
    """The backend builds a forward's slots and mask once, at its first layer: every layer's
    output is then what that layer alone computes, and the next forward (other requests, lengths,
    modes) is not served the last one's."""
    from types import SimpleNamespace

    g = torch.Generator().manual_seed(3)
    _, _, r2t, _, _ = _setup(g, [0] * 4, 1)
    pool = _Layers(g, 3)
    backend = _paged_backend(r2t, pool)

    def mode(decode: bool):
        return SimpleNamespace(is_decode_or_idle=lambda: decode, is_target_verify=lambda: False)

    forwards = [  # (decode?, requests, seq_lens, extend lens)
        (True, torch.tensor([2, 0, 3]), torch.tensor([9, 30, 4]), None),
        (True, torch.tensor([1, 3]), torch.tensor([17, 6]), None),
        (False, torch.tensor([0, 2]), torch.tensor([12, 7]), torch.tensor([5, 1])),  # extend: ragged queries
    ]
    for decode, req, seq, ext in forwards:
        q_lens = torch.ones_like(seq) if decode else ext
        fb = SimpleNamespace(forward_mode=mode(decode), seq_lens=seq, req_pool_indices=req, extend_seq_lens=ext)
        backend.init_forward_metadata(fb)
        visible = causal_mask(q_lens, seq, int(q_lens.max()), int(seq.max()))
        for i in range(3):
            q = torch.randn(int(q_lens.sum()), H * D, generator=g)
            run = backend.forward_decode if decode else backend.forward_extend
            got = run(q, None, None, _layer(i), fb, save_kv_cache=False)
            want = paged_sdpa(q.view(-1, H, D), pool.k[i], pool.v[i], r2t, req, q_lens, seq, visible, 0.3)
            assert torch.equal(got, want.reshape(-1, H * D)), (decode, i)
        assert list(backend.paged) == [None]  # one batch for the forward's (unwindowed) layers


@pytest.mark.parametrize("ragged", [False, True])
def test_a_verify_of_the_roots_alone_is_a_decode(ragged: bool) -> None:
    """A target verify whose requests each verify their root alone (a plain step: one slot wide,
    or ragged lengths of 1 in a wider layout) builds no tree mask, and each root attends to its
    prefix and itself exactly as a decode query at the next position does."""
    from types import SimpleNamespace

    from sglang_echo.core.dense import RAGGED_MARK

    g = torch.Generator().manual_seed(5)
    _, _, r2t, _, _ = _setup(g, [0] * 4, 1)
    backend, layer = _paged_backend(r2t, _Layers(g, 1)), _layer(0)
    req, prefix = torch.tensor([3, 0, 2]), torch.tensor([9, 30, 4])
    width = 4 if ragged else 1
    spec = SimpleNamespace(draft_token_num=width, tree_topk=-1, custom_mask=torch.ones(len(req) * width * width))
    if ragged:
        setattr(spec, RAGGED_MARK, torch.ones(len(req), dtype=torch.int64))
    verify = SimpleNamespace(
        forward_mode=SimpleNamespace(is_decode_or_idle=lambda: False, is_target_verify=lambda: True),
        seq_lens=prefix,
        req_pool_indices=req,
        spec_info=spec,
    )
    backend.init_forward_metadata(verify)
    assert backend.extend_metadata.tree is None
    q = torch.randn(len(req), H * D, generator=g)
    got = backend.forward_extend(q, None, None, layer, verify, save_kv_cache=False)
    decode = SimpleNamespace(
        forward_mode=SimpleNamespace(is_decode_or_idle=lambda: True), seq_lens=prefix + 1, req_pool_indices=req
    )
    backend.init_forward_metadata(decode)
    assert torch.equal(got, backend.forward_decode(q, None, None, layer, decode, save_kv_cache=False))
