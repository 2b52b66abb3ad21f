"""DART: the head's d shifted logits, its checkpoint layout, COMBINE, Algorithm 1, and lossless
speculative decoding with the drafter under every core policy (the n-gram trie:
test_ngram_trie.py).

Heads are tiny and random, in float64 on the CPU (top-k picks are then stable across summation
orders); the references are written out position by position, without caches or batching.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_echo.core.baselines import Chain, StaticTree
from sglang_echo.core.policy import Frontier, build_trees
from sglang_echo.drafters.dart import DartDrafter, DartTreePolicy
from sglang_echo.drafters.dart_head import DartConfig, DartHead
from sglang_echo.drafters.dart_search import CombineConfig, combine
from sglang_echo.drafters.hybrid import HybridDrafter
from sglang_echo.drafters.ngram_trie import (
    NGramTrie,
    continuation_prob,
)
from sglang_echo.models.tiny import draft_vocab_ids

V, VD, H, D = 97, 40, 32, 4
DT = torch.float64


def make_head(seed: int = 0, depth: int = D, shared: bool = False, dtype=DT) -> DartHead:
    cfg = DartConfig(
        hidden_size=H,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=48,
        vocab_size=V,
        draft_vocab_size=VD,
        aux_layer_ids=(1, 2, 3),
        depth=depth,
        shared_mask=shared,
    )
    g = torch.Generator().manual_seed(seed)
    head = DartHead(cfg, torch.randn(V, H, generator=g))
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
        ids = draft_vocab_ids(V, VD, seed)
        head.d2t.copy_(ids - torch.arange(VD))
        head.t2d.zero_().index_fill_(0, ids, True)
    return head.to(dtype)


class History:
    def __init__(self, lengths: list[int], seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.toks = [torch.randint(0, V, (n,), generator=g) for n in lengths]
        self.feats = [torch.randn(n, 3 * H, generator=g, dtype=DT) for n in lengths]


@torch.no_grad()
def naive_shifted_logits(head: DartHead, feats: torch.Tensor, toks: torch.Tensor) -> torch.Tensor:
    """Committed pairs ``(h_t, x_{t+1})`` for t < n, then d-1 masks; every position computed on its
    own with an explicit softmax over the positions before it: ``[d, Vd]`` log-probs."""
    n, m = len(toks) - 1, head.cfg.depth - 1
    rows = []  # (q, k, v, residual) per position
    for t in range(n + m):
        if t < n:
            x, res = head.pair_inputs(head.fuse(feats[t])[None], toks[t + 1 : t + 2])
        else:
            x, res = head.mask_inputs(torch.tensor([t - n]))
        q, k, v = head.qkv(x[None], torch.tensor([[t]]))
        rows.append((q[0, :, 0], k[0, :, 0], v[0, :, 0], res[0]))
    rep = head.cfg.num_attention_heads // head.cfg.num_key_value_heads
    out = []
    for t in range(n - 1, n + m):
        q = rows[t][0]  # [heads, D]
        ks = torch.stack([r[1] for r in rows[: t + 1]], 1).repeat_interleave(rep, 0)  # [heads, t+1, D]
        vs = torch.stack([r[2] for r in rows[: t + 1]], 1).repeat_interleave(rep, 0)
        w = torch.softmax((ks @ q[:, :, None])[..., 0] / math.sqrt(q.shape[-1]), -1)
        attn = (w[..., None] * vs).sum(1)  # [heads, D]
        h = head.layer_output(attn[None, :, None, :], rows[t][3][None, None])
        out.append(torch.log_softmax(head.logits(h)[0, 0], -1))
    return torch.stack(out)


def draft_id(head: DartHead, target_ids: torch.Tensor) -> torch.Tensor:
    table = torch.full((V,), -1, dtype=torch.int64)
    table[head.to_target(torch.arange(VD))] = torch.arange(VD)
    return table[target_ids]


def caught_up(head, hist: History, cuts=None, **kw) -> DartDrafter:
    drafter = DartDrafter(head, **kw)
    drafter.start(hist.toks)
    if cuts is None:
        drafter.catch_up([t[1:] for t in hist.toks], [f[:-1] for f in hist.feats])
    else:  # ragged chunks: cuts[b] = boundaries inside toks[1:]
        for i in range(len(cuts[0]) - 1):
            drafter.catch_up(
                [t[1:][c[i] : c[i + 1]] for t, c in zip(hist.toks, cuts)],
                [f[:-1][c[i] : c[i + 1]] for f, c in zip(hist.feats, cuts)],
            )
    return drafter


def root_frontier(B: int, roots: torch.Tensor) -> Frontier:
    return Frontier(
        0,
        torch.zeros(B, 1, dtype=torch.int64),
        torch.full((B, 1), -1),
        roots[:, None],
        torch.zeros(B, 1),
        torch.ones(B, dtype=torch.bool),
    )


# -- 1. the head: d shifted logits ---------------------------------------------------------------
@pytest.mark.parametrize("shared", [False, True])
def test_marginals_equal_the_naive_per_position_reference(shared):
    head = make_head(seed=1, shared=shared)
    hist = History([9, 4, 13], seed=1)
    cuts = [[0, 3, 3, 8], [0, 1, 2, 3], [0, 0, 7, 12]]  # ragged catch-ups, some empty
    drafter = caught_up(head, hist, cuts)
    got = drafter.marginals()
    assert got.shape == (3, D, VD)
    for b in range(3):
        ref = naive_shifted_logits(head, hist.feats[b], hist.toks[b])
        torch.testing.assert_close(got[b], ref, atol=1e-10, rtol=0)
        n = len(hist.toks[b]) - 1
        fast = torch.log_softmax(head.prefix_logits(head.fuse(hist.feats[b][:n]), hist.toks[b][1:]), -1)
        torch.testing.assert_close(fast, ref, atol=1e-10, rtol=0)


def test_propose_without_ngram_reads_each_depths_marginal():
    head = make_head(seed=2)
    hist = History([7, 10], seed=2)
    drafter = caught_up(head, hist, use_ngram=False)
    trees, _ = build_trees(Chain(D + 2), drafter, torch.stack([t[-1] for t in hist.toks]))
    for b in range(2):
        ref = naive_shifted_logits(head, hist.feats[b], hist.toks[b])
        t = trees.request(b)
        assert t.num_nodes == D + 1  # nothing past the head's last marginal
        for depth in range(1, D + 1):  # the marginal of depth d, whatever the path: its argmax
            assert int(t.tokens[depth]) == int(head.to_target(ref[depth - 1].argmax()))
            assert float(t.logprob[depth]) == pytest.approx(float(ref[depth - 1].max()), abs=1e-6)


def test_catch_up_rejects_bad_input_and_empty_requests_draft_nothing():
    drafter = DartDrafter(make_head())
    drafter.start([torch.zeros(3, dtype=torch.int64)] * 2)
    with pytest.raises(ValueError):
        drafter.catch_up([torch.tensor([1, 2])], [torch.zeros(2, 3 * H)])
    with pytest.raises(ValueError):
        drafter.catch_up([torch.tensor([1, 2]), torch.tensor([3])], None)
    drafter.catch_up(
        [torch.tensor([1, 2]), torch.tensor([], dtype=torch.int64)],
        [torch.zeros(2, 3 * H, dtype=DT), torch.zeros(0, 3 * H, dtype=DT)],
    )
    c = drafter.propose(root_frontier(2, torch.tensor([2, 0])), 3)
    assert c.valid.tolist() == [[True] * 3, [False] * 3]
    with pytest.raises(RuntimeError, match="depth"):
        drafter.propose(root_frontier(2, torch.tensor([2, 0])), 3)


# -- 2. checkpoints --------------------------------------------------------------------------------
SPECFORGE_KEYS = {
    "fc.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    "t2d",
    "midlayer.mask_rep",
    *(f"midlayer.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")),
    *(f"midlayer.self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj")),
    *(f"midlayer.mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")),
}


@pytest.mark.parametrize("shared", [False, True])
def test_checkpoint_round_trip(tmp_path, shared):
    head = make_head(seed=3, shared=shared, dtype=torch.float32)
    head.save(tmp_path / "h", dtype=torch.float32)
    saved = load_file(str(tmp_path / "h" / "model.safetensors"))
    assert set(saved) == SPECFORGE_KEYS
    assert saved["midlayer.mask_rep"].shape == ((2 * H,) if shared else (D - 1, 2 * H))
    assert saved["midlayer.self_attn.q_proj.weight"].shape == (32, 2 * H) and saved["fc.weight"].shape == (H, 3 * H)
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMDart"] and cfg["model_type"] == "llama"
    assert cfg["draft_length"] == D - 1 and cfg["draft_vocab_size"] == VD and cfg["num_hidden_layers"] == 1
    assert cfg["dart_mask_embeddings"] == ("shared" if shared else "per_position")
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    again = DartHead.load(tmp_path / "h", head.embed)
    assert again.cfg == head.cfg
    for (n1, p1), (n2, p2) in zip(head.state_dict().items(), again.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1
    hist = History([6, 9], seed=3)
    hist.feats = [f.float() for f in hist.feats]
    assert torch.equal(caught_up(head, hist).marginals(), caught_up(again, hist).marginals())

    # A released-DART style config (no dart_mask_embeddings, no eagle_config) with one [2H] mask vector.
    cfg.pop("dart_mask_embeddings"), cfg.pop("eagle_config")
    (tmp_path / "rel").mkdir()
    (tmp_path / "rel" / "config.json").write_text(json.dumps(cfg))
    saved["midlayer.mask_rep"] = saved["midlayer.mask_rep"].reshape(-1, 2 * H)[0]
    save_file(saved, str(tmp_path / "rel" / "model.safetensors"))
    rel = DartHead.load(tmp_path / "rel", head.embed, num_target_layers=6)
    assert rel.cfg.shared_mask and rel.cfg.aux_layer_ids == (2, 3, 3) and rel.cfg.depth == D

    # The default export is bf16 (ids untouched); a wrong mask shape is a clear error.
    head.save(tmp_path / "bf16")
    bf = load_file(str(tmp_path / "bf16" / "model.safetensors"))
    assert bf["fc.weight"].dtype == torch.bfloat16 and bf["d2t"].dtype == torch.int64
    bad = {**saved, "midlayer.mask_rep": torch.zeros(5, 2 * H)}
    with pytest.raises(ValueError, match="mask_rep"):
        make_head(shared=False, dtype=torch.float32).import_state(bad)


# -- 3. the n-gram trie (its own tests: test_ngram_trie.py) -------------------------------------------
def test_a_trie_of_another_vocabulary_is_refused():
    with pytest.raises(ValueError, match="vocabulary"):
        DartDrafter(make_head(), trie=NGramTrie.build([torch.tensor([1, 2, 3])], vocab_size=V + 1))


# -- 4. COMBINE ------------------------------------------------------------------------------------
def test_combine_against_hand_computed_numbers():
    cfg = CombineConfig()
    p = torch.tensor([0.5, 0.3, 0.1])  # a top-3 marginal covering M = 0.9
    log_pt = torch.log(p / 0.9)
    ng = torch.tensor([0.0, 0.5, 1.0])
    e, logq = combine(log_pt, ng, level=2, cfg=cfg)
    # level 2: w_logit = 0.9^2 = 0.81, w_ng = 0.5, w_level = 3^-0.7
    hand = [
        0.81 * math.log(5 / 9 + 1e-10) + 0.5 * math.log(1e-10),
        0.81 * math.log(3 / 9 + 1e-10) + 0.5 * math.log(0.5 + 1e-10),
        0.81 * math.log(1 / 9 + 1e-10) + 0.5 * math.log(1.0 + 1e-10),
    ]
    assert e.tolist() == pytest.approx(hand, rel=1e-6)
    assert (cfg.w_level(2) * e).tolist() == pytest.approx([3**-0.7 * h for h in hand], rel=1e-6)
    z = sum(math.exp(h) for h in hand)
    assert logq.tolist() == pytest.approx([h - math.log(z) for h in hand], rel=1e-6)
    assert torch.argsort(e, descending=True).tolist() == [1, 2, 0]  # the n-gram overrules the logit
    # Without the n-gram term (and at level 0) q is the marginal: log q + log M = log p.
    _, logq0 = combine(log_pt, None, level=0, cfg=cfg)
    assert (logq0 + math.log(0.9)).tolist() == pytest.approx(torch.log(p).tolist(), rel=1e-6)


def test_propose_ranks_children_by_combine_with_normalised_probabilities():
    head = make_head(seed=4)
    hist = History([8, 12], seed=4)
    corpus = torch.randint(0, V, (4000,), generator=torch.Generator().manual_seed(4))
    trie = NGramTrie.build([corpus], vocab_size=V)
    cfg = CombineConfig(topk=VD)  # every draft token is a candidate: q sums to 1
    drafter = caught_up(head, hist, trie=trie, combine_cfg=cfg, local_weight=0.0)
    B = 2
    c1 = drafter.propose(root_frontier(B, torch.stack([t[-1] for t in hist.toks])), 3)
    src = torch.tensor([[2, 0]] * B)
    c2 = drafter.propose(
        Frontier(1, src + 1, src, c1.tokens.gather(1, src), torch.zeros(B, 2), torch.ones(B, dtype=torch.bool)), 4
    )
    for b in range(B):
        marg = naive_shifted_logits(head, hist.feats[b], hist.toks[b])
        # Level 0: the root's children are the marginal's top-3 with its log-probabilities.
        torch.testing.assert_close(c1.logprob[b].double(), marg[0].topk(3).values, atol=1e-6, rtol=0)
        for f in range(2):
            parent = int(c1.tokens[b, int(src[b, f])])
            ctx = torch.tensor([int(hist.toks[b][-1]), parent])
            cand = head.to_target(torch.arange(VD))
            ng, _ = continuation_prob(ctx.expand(1, VD, 2), cand[None], 3, V, trie=trie)
            e, logq = combine(marg[1].float(), ng[0], level=1, cfg=cfg)
            best = torch.sort(e, descending=True, stable=True).indices[:4]
            assert c2.tokens[b, 4 * f : 4 * f + 4].tolist() == cand[best].tolist()
            torch.testing.assert_close(c2.logprob[b, 4 * f : 4 * f + 4], logq[best], atol=1e-5, rtol=0)
            assert float(logq.exp().sum()) == pytest.approx(1.0)


# -- 5. Algorithm 1 ---------------------------------------------------------------------------------
def test_algorithm1_matches_the_python_reference():
    head = make_head(seed=5, depth=3)
    hist = History([9, 6, 11], seed=5)
    corpus = torch.randint(0, 12, (3000,), generator=torch.Generator().manual_seed(5)) * 7  # few, frequent ids
    trie = NGramTrie.build([corpus, *hist.toks], vocab_size=V)
    cfg = CombineConfig(topk=6, beam=4, budget=11)
    eos = int(head.to_target(torch.tensor(3)))
    drafter = caught_up(head, hist, trie=trie, combine_cfg=cfg, local_weight=0.0, eos_id=eos)
    roots = torch.stack([t[-1] for t in hist.toks])
    trees = drafter.algorithm1(roots, active=torch.tensor([True, False, True]))
    assert trees.sizes.tolist() == [12, 1, 12]
    for b in (0, 2):
        marg = naive_shifted_logits(head, hist.feats[b], hist.toks[b])
        tops = [(m.topk(cfg.topk).values, head.to_target(m.topk(cfg.topk).indices)) for m in marg]
        ref = _reference_algorithm1_ids(tops, hist.toks[b][-2:].tolist(), trie, cfg, eos)
        t = trees.request(b)
        got = {}
        for i in range(1, t.num_nodes):
            path, p = [int(t.tokens[i])], int(t.parents[i])
            while p > 0:
                path.append(int(t.tokens[p]))
                p = int(t.parents[p])
            got[tuple(path[::-1])] = i
        assert set(got) == set(ref)
        assert (t.parents[1:] < torch.arange(1, t.num_nodes)).all()  # topological, ancestor-closed
    policy = DartTreePolicy(max_depth=3)
    policy.bind(drafter)
    via_policy, _ = build_trees(policy, drafter, roots)
    assert via_policy.tokens.tolist() == drafter.algorithm1(roots).tokens.tolist()


def _reference_algorithm1_ids(tops, root_ctx, trie, cfg, eos):
    """Alg. 1 in plain Python (fvliang/DART searcher.cpp) over the top-k (log-prob, target id) of
    each marginal: {path: score} of the kept nodes."""
    cands, tree = [((), 0.0)], []
    for level, (lp, toks) in enumerate(tops):
        pt = torch.softmax(lp, -1).tolist()
        nxt = []
        for seq, sc in cands:
            ctx = (list(root_ctx) + list(seq))[-2:]
            for t, p in zip(toks.tolist(), pt):
                s = cfg.w_logit(level) * math.log(p + cfg.eps)
                if level > 0:
                    ng, _ = continuation_prob(torch.tensor([[ctx]]), torch.tensor([[t]]), 3, V, trie=trie)
                    s += cfg.w_ng * math.log(float(ng) + cfg.eps)
                nxt.append((seq + (t,), sc + min(cfg.w_level(level) * s, 0.0)))
        tree += nxt
        nxt.sort(key=lambda c: (c[0][-1] == eos, -c[1]))
        cands = nxt[: cfg.beam]
    tree.sort(key=lambda c: -c[1])
    return dict(tree[: cfg.budget])


# -- 6. lossless through the offline loop ----------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory, smollm2_dir):
    from sglang_echo.models.tiny import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("dart") / "tiny-llama", smollm2_dir).path


def _tiny_drafter(target, ar_tokens, prompts, use_ngram=True):
    """A DART head for the tiny target (its layer output passed through, the target's LM head rows)
    and a trie of the greedy outputs: exercises every path; acceptance itself is not the point."""
    tcfg = target.config
    hcfg = DartConfig.for_target(tcfg.to_dict(), draft_vocab_size=512, aux_layer_ids=(0, 1, 2), depth=4)
    embed = target.model.get_input_embeddings().weight.detach()
    head = DartHead(hcfg, embed)
    ids = torch.arange(512)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape) * 0.02)
        head.fc.weight.zero_()[:, -tcfg.hidden_size :] = torch.eye(tcfg.hidden_size)
        head.o_proj.weight.zero_()
        head.down_proj.weight.zero_()
        head.lm_head.weight.copy_(target.lm_head.weight[ids])
        head.norm.weight.copy_(target.model.model.norm.weight)
        for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
            getattr(head, n).weight.fill_(1.0)
        head.d2t.zero_()
        head.t2d.zero_()[:512] = True
    trie = NGramTrie.build([torch.tensor(t) for t in ar_tokens] + list(prompts), vocab_size=tcfg.vocab_size)
    return DartDrafter(head, trie=trie, use_ngram=use_ngram, eos_id=None)


def test_lossless_under_every_policy(tiny_target):
    from sglang_echo.core.factory import POLICIES, PolicyConfig, make_policy
    from sglang_echo.eval import HFTarget, autoregressive_generate, speculative_generate

    target = HFTarget.from_pretrained(tiny_target, captured_layers=(0, 1, 2))
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 512, (n,), generator=g) for n in (6, 11, 3)]
    ar = autoregressive_generate(target, prompts, 16)
    drafter = _tiny_drafter(target, ar.tokens, prompts)
    cfg = PolicyConfig(k_max=20, max_depth=5, w_def=1, w_max=3, topk=3, total_tokens=12)
    for name in POLICIES:
        res = speculative_generate(target, drafter, make_policy(name, cfg), prompts, 16)
        assert res.tokens == ar.tokens, name
        assert res.mat >= 1.0
    policy = DartTreePolicy(max_depth=4)
    policy.bind(drafter)
    res = speculative_generate(target, drafter, policy, prompts, 16)
    assert res.tokens == ar.tokens and max(res.verified_total) <= 3 * 60
    off = _tiny_drafter(target, ar.tokens, prompts, use_ngram=False)
    res = speculative_generate(target, off, StaticTree(4, 3, 12), prompts, 16)
    assert res.tokens == ar.tokens
    for name in ("echo", "static-tree"):  # with the n-gram drafter: DART expands its nodes (adopt)
        hybrid = HybridDrafter(_tiny_drafter(target, ar.tokens, prompts))
        res = speculative_generate(target, hybrid, make_policy(name, cfg), prompts, 16)
        assert res.tokens == ar.tokens, f"hybrid {name}"


def test_acceptance_bench_runs_dart(tmp_path, tiny_target, capsys):
    from sglang_echo.bench import acceptance
    from sglang_echo.eval import HFTarget

    target = HFTarget.from_pretrained(tiny_target, captured_layers=(0, 1, 2))
    drafter = _tiny_drafter(target, [[1, 2, 3]], [torch.tensor([4, 5])])
    drafter.head.save(tmp_path / "head", dtype=torch.float32)
    drafter.trie.save(tmp_path / "head" / "ngram-trie.safetensors")  # found next to the head by default
    small = [
        "--model",
        str(tiny_target),
        "--drafter",
        "dart",
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
        "chain3,echo,dart-tree",
    ]
    for extra, trie in (([], "yes"), (["--no-ngram"], None)):
        acceptance.main([*small, *extra, "--out", str(tmp_path / "res")])
        data = json.loads((tmp_path / "res.json").read_text())
        assert all(r["mismatches"] == 0 for r in data["rows"]) and data["captured_layers"] == [0, 1, 2]
        assert data["policies"]["dart-tree"] == "dart-tree-4x20x59"
        assert (f"trie={trie}" in data["drafter_config"]) if trie else "ngram=off" in data["drafter_config"]
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"nope")
    capsys.readouterr()
    assert acceptance.main([*small, "--ngram", str(bad)]) == 1  # found while loading: one line
    err = capsys.readouterr().err
    assert "not a safetensors n-gram trie" in err and err.count("error:") == 1 and "Traceback" not in err
