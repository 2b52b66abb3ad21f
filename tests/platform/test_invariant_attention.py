"""The batch-invariant mode's ops (``--enable-deterministic-inference`` on the CPU platform).

Bit-for-bit checks, at SmolLM2's attention shape (9 query heads, 3 KV heads, head dim 64) and KV
lengths on both sides of the kernel's chunk edges: a query's output is the same alone and inside
any batch, and the same whether decoded, prefilled, extended over a cached prefix, or verified in
a chain or a tree. Also: the kernel is attention (against a naive softmax), and the packed linears
give each row the same bits whatever the number of rows once the mode is on.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from sglang_echo.platform import packed_linear as pl
from sglang_echo.platform.attention import invariant
from sglang_echo.platform.attention.invariant import CHUNK, causal_layout, invariant_attention, tree_layout
from sglang_echo.platform.attention.paged_sdpa import tree_mask
from tests.platform.test_ops import _random_tree_mask

H, HKV, D = 9, 3, 64
POOL, WIDTH = 8192, 640
SCALE = 1 / math.sqrt(D)
DTYPES = [torch.bfloat16, torch.float32]


class Cache:
    """A KV pool with requests' slots scattered through it, as sglang's allocator leaves them."""

    def __init__(self, dtype: torch.dtype, rows: int = 8, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.k = torch.randn(POOL, HKV, D, generator=g).to(dtype)
        self.v = torch.randn(POOL, HKV, D, generator=g).to(dtype)
        self.r2t = torch.randperm(POOL - 1, generator=g)[: rows * WIDTH].add(1).view(rows, WIDTH).to(torch.int32)
        self.g, self.dtype = g, dtype

    def queries(self, n: int) -> torch.Tensor:
        return torch.randn(n, H, D, generator=self.g).to(self.dtype)

    def causal(self, q, req, q_lens, kv_lens) -> torch.Tensor:
        layout = causal_layout(self.r2t, torch.tensor(req), torch.tensor(q_lens), torch.tensor(kv_lens))
        return invariant_attention(q, self.k, self.v, layout, SCALE)

    def decode(self, q, req, kv_lens) -> torch.Tensor:
        return self.causal(q, req, [1] * len(req), kv_lens)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_rows_are_the_same_alone_and_in_any_batch(dtype, monkeypatch) -> None:
    c = Cache(dtype)
    lens = [1, 37, CHUNK, CHUNK + 1, 300, 2 * CHUNK, 611]  # within one chunk, at and past the edges
    q = c.queries(len(lens))
    req = list(range(len(lens)))
    alone = torch.cat([c.decode(q[i : i + 1], [i], [n]) for i, n in enumerate(lens)])
    assert torch.equal(c.decode(q, req, lens), alone)
    monkeypatch.setattr(invariant, "_FLOATS_PER_BLOCK", 1)  # one chunk per matmul: the same bits
    assert torch.equal(c.decode(q, req, lens), alone)
    order = [5, 0, 3]  # another batch, another order
    assert torch.equal(c.decode(q[order], order, [lens[i] for i in order]), alone[order])


@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_extend_and_chain_verify_equal_decoding(dtype) -> None:
    """Query at position p: the same bits in a whole prefill, an extend over a cached prefix
    (with another request in the batch), a chain verify of 7 tokens, and decoding."""
    c = Cache(dtype)
    total = 2 * CHUNK + 60
    q = c.queries(total)
    decoded = torch.cat([c.decode(q[p : p + 1], [0], [p + 1]) for p in range(total)])
    assert torch.equal(c.causal(q, [0], [total], [total]), decoded)  # one prefill
    cached = CHUNK - 3
    other = c.queries(50)
    got = c.causal(torch.cat([other, q[cached:]]), [4, 0], [50, total - cached], [90, total])
    assert torch.equal(got[50:], decoded[cached:])  # extend after a prefix-cache hit, batched
    k = 7
    for prefix in (CHUNK - 4, 300):  # a chain verify across a chunk edge, and inside one
        got = c.causal(q[prefix : prefix + k], [0], [k], [prefix + k])
        assert torch.equal(got, decoded[prefix : prefix + k])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(3))
def test_tree_verify_nodes_equal_decoding_their_path(dtype, seed: int) -> None:
    """Each node of a verify tree (ragged: some requests query fewer nodes) gets the bits of the
    token decoded alone after its accepted ancestors, i.e. with its path's KV moved into place."""
    c = Cache(dtype, seed=seed)
    n = 9
    prefix, q_lens = torch.tensor([CHUNK - 3, 40, 2 * CHUNK - 1]), torch.tensor([n, 5, n])
    bs = len(prefix)
    anc = _random_tree_mask(c.g, bs, n)
    real = torch.arange(n)[None, :] < q_lens[:, None]  # ragged: real nodes see only real nodes
    anc = torch.where(real[:, :, None] & real[:, None, :], anc, torch.eye(n, dtype=torch.bool)[None])
    req = torch.tensor([2, 0, 5])
    visible = tree_mask(anc.reshape(-1), prefix, n, int((prefix + q_lens).max()))[:, : int(q_lens.max())]
    layout = tree_layout(c.r2t, req, prefix, q_lens, visible)
    q = c.queries(int(q_lens.sum()))
    got = invariant_attention(q, c.k, c.v, layout, SCALE)

    t, decode_row = 0, 7  # a spare request row: the committed path of one node at a time
    for b in range(bs):
        p, row = int(prefix[b]), c.r2t[req[b]]
        for j in range(int(q_lens[b])):
            path = anc[b, j].nonzero().flatten()  # ancestors and itself, root first
            c.r2t[decode_row, :p] = row[:p]
            c.r2t[decode_row, p : p + len(path)] = row[p + path]
            want = c.decode(q[t : t + 1], [decode_row], [p + len(path)])
            assert torch.equal(got[t : t + 1], want), f"request {b} node {j}"
            t += 1


@pytest.mark.parametrize("window", [None, 50])
def test_it_is_attention(window) -> None:
    """float32 against a naive softmax over each query's visible keys."""
    c = Cache(torch.float32)
    q_lens, kv_lens, req = [3, 1, 5], [300, 7, 133], [1, 4, 2]
    q = c.queries(sum(q_lens))
    layout = causal_layout(c.r2t, torch.tensor(req), torch.tensor(q_lens), torch.tensor(kv_lens))
    got = invariant_attention(q, c.k, c.v, layout, SCALE, window)
    want, t = [], 0
    for b, (ql, kvl) in enumerate(zip(q_lens, kv_lens)):
        for i in range(ql):
            pos = kvl - ql + i
            lo = 0 if window is None else max(0, pos - window)
            slots = c.r2t[req[b], lo : pos + 1].long()
            for h in range(H):
                s = (c.k[slots, h // (H // HKV)] @ q[t, h]) * SCALE
                want.append(torch.softmax(s, 0) @ c.v[slots, h // (H // HKV)])
            t += 1
    torch.testing.assert_close(got, torch.stack(want).view(-1, H, D), rtol=1e-5, atol=1e-5)


@pytest.fixture
def invariant_linears():
    pl.set_batch_invariant(True)
    yield
    pl.set_batch_invariant(False)


@pytest.mark.skipif(not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"), reason="no oneDNN")
@pytest.mark.parametrize("dtype", DTYPES)
# SmolLM2's down, qkv, gate_up and LM head (the last: another kernel past 32 bf16 rows on AMX)
@pytest.mark.parametrize("out_f,in_f", [(576, 1536), (960, 576), (3072, 576), (49152, 576)])
def test_packed_linear_rows_do_not_depend_on_the_row_count(dtype, out_f, in_f, invariant_linears) -> None:
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("no oneDNN bf16 on this CPU")
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(out_f, in_f, generator=g) / math.sqrt(in_f)).to(dtype)
    packed = pl.PackedWeight(w).packed
    x = torch.randn(300, in_f, generator=g).to(dtype)
    full = pl.packed_linear(x, packed)
    for m in (1, 2, 3, 17, 32, 33, 40, 64, 65, 128):
        assert torch.equal(pl.packed_linear(x[:m], packed), full[:m]), f"{m} rows"
    assert torch.equal(torch.cat([pl.packed_linear(x[i : i + 1], packed) for i in range(16)]), full[:16])
    order = torch.randperm(64, generator=g)  # a row's place in its call does not matter either
    assert torch.equal(pl.packed_linear(x[:64][order], packed), full[:64][order])


def test_batch_invariant_calls_hold_2_to_32_rows(monkeypatch, invariant_linears) -> None:
    """The mode's row rule itself, on any host: every oneDNN call gets 2 to 32 rows, and the rows
    come back in order (a stand-in kernel returns each row's index)."""
    calls = []

    def kernel(x2, packed, bias):
        calls.append(x2.shape[0])
        return x2[:, :1].clone()

    monkeypatch.setattr(pl, "_linear", kernel)
    for rows in (1, 2, 31, 32, 33, 64, 65, 97):
        calls.clear()
        x = torch.arange(rows, dtype=torch.float32)[:, None].expand(rows, 4)
        out = pl.packed_linear(x, None)
        assert out.flatten().tolist() == list(range(rows)), rows
        assert all(2 <= c <= 32 for c in calls) and sum(calls) == rows + (rows % 32 == 1), (rows, calls)


# -- the switch ----------------------------------------------------------------------------------
class _Hooks:
    def __init__(self) -> None:
        self.registered: dict[str, object] = {}

    def register(self, target: str, fn, kind) -> None:
        self.registered[target] = fn


def test_sglang_accepts_echo_torch_in_the_mode_and_the_runner_turns_it_on(monkeypatch) -> None:
    from sglang.srt.arg_groups.choices import (
        DETERMINISTIC_ATTENTION_BACKEND_CHOICES,
        RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND,
    )

    from sglang_echo.platform import deterministic

    hooks = _Hooks()
    deterministic.register(hooks, "around")
    assert "echo_torch" in DETERMINISTIC_ATTENTION_BACKEND_CHOICES
    assert "echo_torch" in RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND  # a cached prefix changes no bits
    hook = hooks.registered[deterministic.RUNNER_HOOK]
    calls = []
    sglangs = lambda runner: calls.append(runner.device)  # noqa: E731  (raises on a CPU in sglang)
    monkeypatch.setattr(pl, "_INVARIANT", False)
    monkeypatch.setattr(deterministic, "enabled", lambda: False)
    hook(sglangs, SimpleNamespace(device="cpu"))
    assert not pl.batch_invariant() and calls == ["cpu"]  # mode off: sglang's own no-op
    monkeypatch.setattr(deterministic, "enabled", lambda: True)
    hook(sglangs, SimpleNamespace(device="cuda"))
    assert not pl.batch_invariant() and calls == ["cpu", "cuda"]  # a GPU runner: sglang's Triton ops
    hook(sglangs, SimpleNamespace(device="cpu"))
    assert pl.batch_invariant() and calls == ["cpu", "cuda"]  # the platform's mode instead
    monkeypatch.setenv(pl.ENV, "0")
    with pytest.raises(RuntimeError, match=pl.ENV):
        deterministic.enable_batch_invariant_ops()


class _Mode:
    def __init__(self, kind: str) -> None:
        self.kind = kind

    def is_decode_or_idle(self) -> bool:
        return self.kind == "decode"

    def is_target_verify(self) -> bool:
        return self.kind == "verify"


def test_the_backend_in_the_mode_verifies_a_tree_as_it_decodes(monkeypatch) -> None:
    """``echo_torch`` with the flag on, through sglang's metadata: an EAGLE top-k tree verified
    (QLEN_ONLY mask) gives each node the bits of the decode step that would follow its path."""
    from sglang_echo.platform import deterministic
    from sglang_echo.platform.attention.backend import EchoTorchAttnBackend

    monkeypatch.setattr(deterministic, "enabled", lambda: True)
    c = Cache(torch.bfloat16, seed=3)
    pool = SimpleNamespace(get_key_buffer=lambda i: c.k, get_value_buffer=lambda i: c.v)
    backend = EchoTorchAttnBackend(
        SimpleNamespace(device="cpu", req_to_token_pool=SimpleNamespace(req_to_token=c.r2t), token_to_kv_pool=pool)
    )
    assert backend.deterministic
    layer = SimpleNamespace(
        tp_q_head_num=H,
        qk_head_dim=D,
        v_head_dim=D,
        layer_id=0,
        scaling=SCALE,
        sliding_window_size=-1,
        is_cross_attention=False,
        logit_cap=0,
    )
    n, prefix, req = 6, torch.tensor([CHUNK - 2, 9]), torch.tensor([3, 1])
    anc = _random_tree_mask(c.g, 2, n)
    spec = SimpleNamespace(draft_token_num=n, tree_topk=2, custom_mask=anc.reshape(-1))
    verify = SimpleNamespace(forward_mode=_Mode("verify"), seq_lens=prefix, spec_info=spec, req_pool_indices=req)
    backend.init_forward_metadata(verify)
    q = c.queries(2 * n)
    got = backend.forward_extend(q.view(2 * n, H * D), None, None, layer, verify, save_kv_cache=False).view(-1, H, D)
    for b in range(2):
        p, row = int(prefix[b]), c.r2t[req[b]].clone()
        for j in range(n):
            path = anc[b, j].nonzero().flatten()
            c.r2t[7, :p], c.r2t[7, p : p + len(path)] = row[:p], row[p + path]
            step = SimpleNamespace(
                forward_mode=_Mode("decode"), seq_lens=torch.tensor([p + len(path)]), req_pool_indices=torch.tensor([7])
            )
            backend.init_forward_metadata(step)
            want = backend.forward_decode(q[b * n + j].reshape(1, H * D), None, None, layer, step, save_kv_cache=False)
            assert torch.equal(got[b * n + j].reshape(1, -1), want), f"request {b} node {j}"
