"""DFlash: the head's checkpoint layout (z-lab / sglang), lazy catch-up against a from-scratch block
forward, per-position top-k proposals, and lossless speculative decoding under every core policy.

Heads are tiny and random, in float64 on the CPU (top-k picks are then stable across summation
orders); the reference recomputes the block over the whole context without any cache.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file

from sglang_echo.core.baselines import Chain, StaticTree
from sglang_echo.core.policy import Frontier, build_trees
from sglang_echo.drafters.dflash import DFlashDrafter
from sglang_echo.drafters.dflash_head import DFlashConfig, DFlashHead, default_target_layer_ids, grouped_block_attention
from sglang_echo.drafters.hybrid import HybridDrafter

V, H, BS = 97, 32, 5
DT = torch.float64


def make_cfg(**kw) -> DFlashConfig:
    base = dict(
        hidden_size=H,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=48,
        vocab_size=V,
        num_hidden_layers=2,
        target_layer_ids=(0, 1, 2),
        num_target_layers=4,
        block_size=BS,
        mask_token_id=3,
        mask_token="<m>",
    )
    return DFlashConfig(**{**base, **kw})


def make_head(seed: int = 0, dtype: torch.dtype = DT, **kw) -> DFlashHead:
    g = torch.Generator().manual_seed(seed)
    head = DFlashHead(make_cfg(**kw), torch.randn(V, H, generator=g), torch.randn(V, H, generator=g))
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            else:  # large enough that the marginals are far from uniform (no near-ties)
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return head.to(dtype)


class History:
    """Random committed tokens and features per request (``feats[b][t]`` is the feature of token ``t``)."""

    def __init__(self, lengths: list[int], seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.toks = [torch.randint(0, V, (n + 1,), generator=g) for n in lengths]  # + the root
        self.feats = [torch.randn(n, 3 * H, generator=g, dtype=DT) for n in lengths]

    def roots(self) -> torch.Tensor:
        return torch.stack([t[-1] for t in self.toks])


def reference(head: DFlashHead, hist: History, b: int) -> torch.Tensor:
    return torch.log_softmax(head.reference_block_logits(hist.feats[b], int(hist.toks[b][-1])).double(), -1)


def roots_frontier(roots: torch.Tensor, active=None) -> Frontier:
    B = roots.numel()
    return Frontier(
        0,
        torch.zeros(B, 1, dtype=torch.int64),
        torch.full((B, 1), -1),
        roots[:, None],
        torch.zeros(B, 1),
        torch.ones(B, dtype=torch.bool) if active is None else active,
    )


# -- 1. checkpoints ------------------------------------------------------------------------------------
# What sglang's DFlashDraftModel.load_weights maps every checkpoint key to (q/k/v -> qkv_proj and
# gate/up -> gate_up_proj shards) and the parameters that model has for a plain DFlash draft.
def sglang_params(n_layers: int) -> set[str]:
    per = (
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        "self_attn.qkv_proj.weight",
        "self_attn.o_proj.weight",
        "self_attn.q_norm.weight",
        "self_attn.k_norm.weight",
        "mlp.gate_up_proj.weight",
        "mlp.down_proj.weight",
    )
    return {"fc.weight", "hidden_norm.weight", "norm.weight"} | {
        f"layers.{i}.{p}" for i in range(n_layers) for p in per
    }


def sglang_param_of(name: str) -> str:
    for shard, stacked in (
        ("q_proj", "qkv_proj"),
        ("k_proj", "qkv_proj"),
        ("v_proj", "qkv_proj"),
        ("gate_proj", "gate_up_proj"),
        ("up_proj", "gate_up_proj"),
    ):
        if f".{shard}." in name:
            return name.replace(shard, stacked)
    return name


def test_checkpoint_round_trip_in_the_zlab_layout(tmp_path):
    head = make_head(seed=1)
    head.save(tmp_path / "h", dtype=torch.float32)
    saved = load_file(str(tmp_path / "h" / "model.safetensors"))
    assert {sglang_param_of(k) for k in saved} == sglang_params(2)
    assert saved["fc.weight"].shape == (H, 3 * H) and saved["layers.1.self_attn.k_norm.weight"].shape == (8,)
    assert not any(k.startswith(("embed", "lm_head")) for k in saved)  # the target's, never stored
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["dflash_config"] == {
        "block_size": BS,
        "target_layer_ids": [0, 1, 2],
        "mask_token_id": 3,
        "mask_token": "<m>",
    }
    assert cfg["block_size"] == BS and cfg["num_target_layers"] == 4 and cfg["num_hidden_layers"] == 2
    assert cfg["layer_types"] == ["full_attention"] * 2 and cfg["is_causal"] is False

    again = DFlashHead.load(tmp_path / "h", head.embed, head.lm_head)
    assert again.cfg == head.cfg and again.cfg.captured_layers == (1, 2, 3)
    for (n1, p1), (n2, p2) in zip(head.state_dict().items(), again.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1
    hist = History([6, 3], seed=1)
    a, b = DFlashDrafter(head), DFlashDrafter(again)
    for d in (a, b):
        d.start(hist.toks)
        d.catch_up([t[1:] for t in hist.toks], hist.feats)
    ta, _ = build_trees(StaticTree(3, 2, 8), a, hist.roots())
    tb, _ = build_trees(StaticTree(3, 2, 8), b, hist.roots())
    assert ta.tokens.tolist() == tb.tokens.tolist() and torch.equal(ta.logprob, tb.logprob)

    head.save(tmp_path / "bf16")  # the shipped default
    bf = load_file(str(tmp_path / "bf16" / "model.safetensors"))
    assert bf.keys() == saved.keys() and all(t.dtype == torch.bfloat16 for t in bf.values())
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"


def test_config_reads_zlab_and_sglang_variants():
    # z-lab's first releases: block_size at the top level, no mask_token string, ids in dflash_config.
    zlab = {
        "architectures": ["DFlashDraftModel"],
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 96,
        "vocab_size": 200,
        "num_hidden_layers": 3,
        "block_size": 16,
        "num_target_layers": 36,
        "rope_theta": 1e6,
        "dflash_config": {"mask_token_id": 151, "target_layer_ids": [1, 17, 33]},
    }
    c = DFlashConfig.from_hf(zlab)
    assert (c.block_size, c.mask_token_id, c.target_layer_ids, c.num_target_layers, c.rope_theta) == (
        16,
        151,
        (1, 17, 33),
        36,
        1e6,
    )
    assert c.captured_layers == (2, 18, 34)
    # No ids: DFlash's default spacing over 1 .. L-3 (sglang's build_target_layer_ids).
    assert DFlashConfig.from_hf({**zlab, "dflash_config": {"mask_token_id": 1}}).target_layer_ids == (1, 17, 33)
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33) and default_target_layer_ids(30, 1) == (15,)
    assert DFlashConfig.from_hf(make_cfg().to_hf()) == make_cfg()
    with pytest.raises(ValueError, match="selector_rank"):  # DFlash2 drafts are not this model
        DFlashConfig.from_hf({**zlab, "dflash_config": {"mask_token_id": 1, "selector_rank": 256}})
    with pytest.raises(ValueError, match="sliding"):
        DFlashConfig.from_hf({**zlab, "layer_types": ["sliding_attention"] * 3})
    with pytest.raises(ValueError, match="mask_token_id"):
        DFlashConfig.from_hf({**zlab, "dflash_config": {}})
    with pytest.raises(ValueError, match="not a DFlash"):
        DFlashConfig.from_hf({**zlab, "architectures": ["LlamaForCausalLMEagle3"]})


# -- 2. lazy catch-up equals a from-scratch block forward ---------------------------------------------
def test_grouped_block_attention_equals_the_dense_block_diagonal_mask():
    """Training's linear-cost attention = SDPA over [context | all blocks] with a block-diagonal mask."""
    g = torch.Generator().manual_seed(3)
    B, Hq, Hk, Tc, n, bs, D = 2, 4, 2, 7, 5, 3, 8
    S = n * bs
    q = torch.randn(B, Hq, S, D, generator=g, dtype=DT)
    kc, vc = (torch.randn(B, Hk, Tc, D, generator=g, dtype=DT) for _ in range(2))
    k, v = (torch.randn(B, Hk, S, D, generator=g, dtype=DT) for _ in range(2))
    ctx_mask = torch.rand(B, 1, S, Tc, generator=g) < 0.6
    ctx_mask[0, :, :bs] = False  # a block that sees no context at all still has its own keys
    blk = torch.arange(S) // bs
    dense = torch.cat([ctx_mask, (blk[:, None] == blk[None, :]).expand(B, 1, S, S)], -1)
    want = torch.nn.functional.scaled_dot_product_attention(
        q, torch.cat([kc, k], 2), torch.cat([vc, v], 2), attn_mask=dense, enable_gqa=True
    )
    torch.testing.assert_close(grouped_block_attention(q, kc, vc, k, v, ctx_mask, bs), want, atol=1e-12, rtol=0)


def test_incremental_catch_up_equals_from_scratch_block():
    head = make_head(seed=2)
    hist = History([12, 7, 9, 1], seed=2)
    d = DFlashDrafter(head)
    assert d.name == "dflash" and d.captured_layers == (1, 2, 3) and d.block_size == BS
    d.start([t[:1] for t in hist.toks])  # tiny initial cache: forces reallocations
    cuts = [[0, 1, 5, 5, 12], [0, 0, 6, 7, 7], [0, 2, 3, 8, 9], [0, 1, 1, 1, 1]]  # ragged, some empty
    for i in range(4):
        d.catch_up(
            [t[1:][c[i] : c[i + 1]] for t, c in zip(hist.toks, cuts)],
            [f[c[i] : c[i + 1]] for f, c in zip(hist.feats, cuts)],
        )
        # A step drafted between catch-ups leaves no trace (nothing drafted is cached).
        build_trees(StaticTree(2, 2, 6), d, torch.stack([t[c[i + 1]] for t, c in zip(hist.toks, cuts)]))
    assert d.lengths.tolist() == [12, 7, 9, 1]
    logp = d.block_marginals(hist.roots())
    assert logp.shape == (4, BS - 1, V)
    for b in range(4):
        torch.testing.assert_close(logp[b], reference(head, hist, b), atol=1e-10, rtol=0)
    # The same request alone in a batch of one: identical marginals (batch independence).
    alone = DFlashDrafter(head)
    alone.start(hist.toks[1:2])
    alone.catch_up([hist.toks[1][1:]], hist.feats[1:2])
    torch.testing.assert_close(alone.block_marginals(hist.roots()[1:2])[0], logp[1], atol=1e-10, rtol=0)


# -- 3. proposals ---------------------------------------------------------------------------------------
def test_propose_reads_the_marginal_of_depth_plus_one():
    head = make_head(seed=3)
    hist = History([5, 8, 4], seed=3)
    d = DFlashDrafter(head)
    d.start(hist.toks)
    d.catch_up([t[1:] for t in hist.toks], hist.feats)
    B = 3
    refs = [reference(head, hist, b) for b in range(B)]
    c1 = d.propose(roots_frontier(hist.roots()), 3)
    assert c1.tokens.shape == (B, 3) and c1.valid.all() and (c1.parent == 0).all() and c1.proposal is None
    for b in range(B):
        top, ids = refs[b][0].topk(3)
        assert c1.tokens[b].tolist() == ids.tolist()
        torch.testing.assert_close(c1.logprob[b].double(), top, atol=1e-6, rtol=0)  # normalised log-probs
        assert float(refs[b][0].exp().sum()) == pytest.approx(1.0)
    # Depth 1: two frontier nodes and an empty slot; request 1 inactive. Every parent gets marginal 2's top-2.
    src = torch.tensor([[2, 0, -1]] * B)
    active = torch.tensor([True, False, True])
    f1 = Frontier(
        1, torch.where(src >= 0, src + 1, -1), src, c1.tokens.gather(1, src.clamp(min=0)), torch.zeros(B, 3), active
    )
    c2 = d.propose(f1, 2)
    assert c2.tokens.shape == (B, 6) and c2.parent[0].tolist() == [0, 0, 1, 1, 2, 2]
    assert c2.valid.tolist() == [[True] * 4 + [False] * 2, [False] * 6, [True] * 4 + [False] * 2]
    for b in (0, 2):
        top, ids = refs[b][1].topk(2)
        assert c2.tokens[b].tolist() == ids.tolist() * 3
        torch.testing.assert_close(c2.logprob[b, :2].double(), top, atol=1e-6, rtol=0)
    with pytest.raises(RuntimeError, match="depth"):
        d.propose(Frontier(3, f1.slots, f1.source, f1.tokens, f1.path_score, active), 2)
    # Past the block (depth >= bs - 1): nothing.
    for depth in range(2, BS):
        c = d.propose(Frontier(depth, f1.slots, f1.source, f1.tokens, f1.path_score, active), 2)
        assert c.valid.any() == (depth < BS - 1)
    # Chains are DFlash's greedy block; a deeper chain stops at the block's end.
    trees, _ = build_trees(Chain(8), d, hist.roots())
    assert trees.sizes.tolist() == [BS] * B
    for b in range(B):
        assert trees.request(b).tokens[1:].tolist() == refs[b].argmax(-1).tolist()


def test_catch_up_rejects_bad_input_and_uncommitted_requests_draft_nothing():
    d = DFlashDrafter(make_head())
    d.start([torch.zeros(3)] * 2)
    with pytest.raises(ValueError):
        d.catch_up([torch.tensor([1, 2])], [torch.zeros(2, 3 * H)])
    with pytest.raises(ValueError):
        d.catch_up([torch.tensor([1, 2]), torch.tensor([3])], None)
    with pytest.raises(ValueError):
        d.catch_up([torch.tensor([1, 2]), torch.tensor([3])], [torch.zeros(2, 3 * H), torch.zeros(2, 3 * H)])
    d.catch_up(
        [torch.tensor([1, 2]), torch.tensor([], dtype=torch.int64)], [torch.zeros(2, 3 * H), torch.zeros(0, 3 * H)]
    )
    c = d.propose(roots_frontier(torch.tensor([2, 0])), 2)
    assert c.valid.tolist() == [[True, True], [False, False]] and torch.isfinite(c.logprob).all()


# -- 4. lossless through the offline loop -----------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory, smollm2_dir):
    from sglang_echo.models.tiny import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("dflash") / "tiny-llama", smollm2_dir, num_layers=4).path


def _tiny_head(target) -> DFlashHead:
    tcfg = target.config.to_dict()
    cfg = DFlashConfig.for_target(tcfg, num_hidden_layers=2, block_size=4, target_layer_ids=(0, 1, 2), mask_token_id=16)
    g = torch.Generator().manual_seed(0)
    head = DFlashHead(cfg, target.model.get_input_embeddings().weight, target.lm_head.weight)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
    return head


def test_lossless_under_every_policy(tiny_target):
    from sglang_echo.core.factory import POLICIES, PolicyConfig, make_policy
    from sglang_echo.eval import HFTarget, autoregressive_generate, speculative_generate

    target = HFTarget.from_pretrained(tiny_target, captured_layers=(1, 2, 3))
    drafter = DFlashDrafter(_tiny_head(target))
    assert drafter.captured_layers == target.captured_layers
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 512, (n,), generator=g) for n in (6, 11, 3)]
    ar = autoregressive_generate(target, prompts, 14)
    cfg = PolicyConfig(k_max=20, max_depth=5, w_def=1, w_max=3, topk=3, total_tokens=12)  # deeper than the block
    for name in POLICIES:
        res = speculative_generate(target, drafter, make_policy(name, cfg), prompts, 14)
        assert res.tokens == ar.tokens, name
        assert res.mat >= 1.0 and max(int(t.max()) for t in res.tree_size) <= 12 * 3 + 1
    res = speculative_generate(target, drafter, StaticTree(6, 3, 12), prompts, 14)
    assert res.tokens == ar.tokens
    for name in ("echo", "static-tree"):  # with the n-gram drafter
        res = speculative_generate(target, HybridDrafter(drafter), make_policy(name, cfg), prompts, 14)
        assert res.tokens == ar.tokens, f"hybrid {name}"


def test_acceptance_bench_runs_dflash(tmp_path, tiny_target, capsys):
    from sglang_echo.bench import acceptance
    from sglang_echo.eval import HFTarget

    target = HFTarget.from_pretrained(tiny_target, captured_layers=(1, 2, 3))
    _tiny_head(target).save(tmp_path / "head", dtype=torch.float32)
    acceptance.main(
        [
            "--model",
            str(tiny_target),
            "--drafter",
            "dflash",
            "--draft",
            str(tmp_path / "head"),
            "--prompts",
            "chat",
            "--per-set",
            "2",
            "--max-new-tokens",
            "6",
            "--batch",
            "2",
            "--max-depth",
            "4",
            "--topk",
            "3",
            "--total-tokens",
            "8",
            "--device",
            "cpu",
            "--policies",
            "chain3,echo",
            "--out",
            str(tmp_path / "res"),
        ]
    )
    data = json.loads((tmp_path / "res.json").read_text())
    assert all(r["mismatches"] == 0 for r in data["rows"]) and data["captured_layers"] == [1, 2, 3]
    assert "block_size=4" in data["drafter_config"]
    # Without --draft: the shipped DFlash head, which was not trained for this tiny target.
    with pytest.raises(SystemExit) as e:  # before the target loads
        acceptance.main(["--model", str(tiny_target), "--drafter", "dflash", "--prompts", "chat"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and re.search("--drafter dflash: .* was trained for a target with", err)
