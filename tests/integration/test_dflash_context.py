"""The server's DFlash context (sglang's draft KV pool, addressed through ``req_to_token``) drafts
what the offline drafter drafts, with no server: prefill chunks and verify steps write the context at
scattered pool slots, and the trees must equal :class:`~sglang_echo.drafters.dflash.DFlashDrafter`'s,
their marginals to float64 rounding (tiny random head)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sglang_echo.core.baselines import StaticTree
from sglang_echo.core.policy import build_trees
from sglang_echo.drafters.dflash import DFlashDrafter
from sglang_echo.integration.dflash import DFlashFrontierDrafter, DFlashPoolContext, extend_positions
from tests.drafters.test_dflash import DT, History, make_head


class FakePool:
    """The two calls the context makes on sglang's ``MHATokenToKVPool``."""

    def __init__(self, layers: int, slots: int, kv_heads: int, head_dim: int):
        self.k = [torch.full((slots, kv_heads, head_dim), float("nan"), dtype=DT) for _ in range(layers)]
        self.v = [torch.full((slots, kv_heads, head_dim), float("nan"), dtype=DT) for _ in range(layers)]

    def get_key_buffer(self, layer_id):
        return self.k[layer_id]

    def get_value_buffer(self, layer_id):
        return self.v[layer_id]

    def set_kv_buffer(self, layer, loc, k, v):
        assert loc.physical
        self.k[layer.layer_id][loc.loc] = k
        self.v[layer.layer_id][loc.loc] = v


def server_context(head, slots: int):
    c = head.cfg
    layers = [
        SimpleNamespace(self_attn=SimpleNamespace(attn=SimpleNamespace(layer_id=i))) for i in range(c.num_hidden_layers)
    ]
    runner = SimpleNamespace(
        token_to_kv_pool=FakePool(c.num_hidden_layers, slots, c.num_key_value_heads, c.head_dim),
        model=SimpleNamespace(layers=layers),
    )
    return DFlashPoolContext(head, runner)


def test_extend_positions_continue_each_prefix():
    assert extend_positions([0, 5, 2], [3, 1, 2], "cpu").tolist() == [0, 1, 2, 5, 2, 3]
    assert extend_positions([], [], "cpu").tolist() == []


def test_pool_context_drafts_what_the_offline_drafter_drafts():
    head = make_head(seed=4)
    lengths = [11, 6, 9]
    hist = History(lengths, seed=4)
    B, cap = len(lengths), 16
    g = torch.Generator().manual_seed(0)
    req_to_token = torch.randperm(B * cap + 7, generator=g)[: B * cap].view(B, cap)  # scattered slots
    ctx = server_context(head, B * cap + 7)
    offline = DFlashDrafter(head)
    offline.start([t[:1] for t in hist.toks])
    # prefill in two chunks (the second one like a chunked / radix-extended prefill), then verify steps
    cuts = [[0, 4, 8, 11], [0, 6, 6, 6], [0, 2, 5, 9]]
    for i in range(3):
        lo = torch.tensor([c[i] for c in cuts])
        hi = torch.tensor([c[i + 1] for c in cuts])
        feats = torch.cat([f[c[i] : c[i + 1]] for f, c in zip(hist.feats, cuts)])
        pos = extend_positions(lo, hi - lo, "cpu")
        rows = torch.repeat_interleave(torch.arange(B), hi - lo)
        ctx.write(feats, pos, req_to_token[rows, pos])
        offline.catch_up(
            [t[1:][c[i] : c[i + 1]] for t, c in zip(hist.toks, cuts)],
            [f[c[i] : c[i + 1]] for f, c in zip(hist.feats, cuts)],
        )

        roots = torch.stack([t[c[i + 1]] for t, c in zip(hist.toks, cuts)])
        batch = SimpleNamespace(seq_lens=hi, req_pool_indices=torch.arange(B))
        worker = SimpleNamespace(req_to_token_pool=SimpleNamespace(req_to_token=req_to_token))
        server = DFlashFrontierDrafter(worker, batch, roots, ctx)
        policy = StaticTree(3, 2, 8)
        want, _ = build_trees(policy, offline, roots)
        got, _ = build_trees(policy, server, roots)
        # same math on differently shaped batches (flat writes vs padded catch-up): float64 rounding only
        torch.testing.assert_close(server.logp, offline.block_marginals(roots), atol=1e-12, rtol=0)
        for name in ("indptr", "tokens", "parents", "depth"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name
        torch.testing.assert_close(got.logprob, want.logprob, atol=1e-6, rtol=0)
        assert server.forwards == 1


class _HF(SimpleNamespace):
    def to_dict(self):
        return dict(vars(self))


def test_capture_layers_come_from_the_dflash_head():
    """sglang's EAGLE-3 aux resolution finds no eagle_config in a DFlash config; the hook supplies
    the head's target_layer_ids (and leaves every other draft and the draft worker alone)."""
    from sglang_echo.integration.dflash import resolve_capture_layers

    head = make_head(seed=5, target_layer_ids=(1, 2), num_target_layers=4)
    dflash_cfg = _HF(**head.cfg.to_hf())
    eagle_cfg = _HF(architectures=["LlamaForCausalLMEagle3"])

    def run(hf, *, eagle3=True, draft_worker=False):
        config = SimpleNamespace(
            draft_model_config=SimpleNamespace(hf_config=hf), eagle_aux_hidden_state_layer_ids=None
        )
        resolve_capture_layers(
            lambda **kw: None,
            config=config,
            server_args=None,
            model_config=SimpleNamespace(hf_text_config=SimpleNamespace(num_hidden_layers=4)),
            spec_algorithm=SimpleNamespace(is_eagle3=lambda: eagle3),
            is_draft_worker=draft_worker,
        )
        return config.eagle_aux_hidden_state_layer_ids

    assert run(dflash_cfg) == [1, 2]
    assert run(eagle_cfg) is None
    assert run(dflash_cfg, draft_worker=True) is None
    assert run(dflash_cfg, eagle3=False) is None
