"""The engine-agnostic EAGLE-3 drafter against a cache-free recomputation of the head.

Everything runs on tiny random heads on the CPU in float64 (so top-k picks are stable across
summation orders): the reference recomputes the head over the whole sequence (committed pairs,
then the drafted path, each draft step fed the previous position's un-normalised output) with a
plain causal mask and no cache, which is what sglang's EAGLE-3 draft computes for one path.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from sglang_echo.core.baselines import Chain, StaticTree
from sglang_echo.core.policy import Frontier, build_trees
from sglang_echo.drafters.eagle3 import Eagle3Drafter
from sglang_echo.drafters.eagle3_head import Eagle3Config, Eagle3Head
from sglang_echo.models.tiny import (
    draft_vocab_ids,
    eagle3_tensors,
    write_tiny_eagle3_draft,
)

V, VD, H = 97, 40, 32
DT = torch.float64


def make_head(seed: int = 0, dtype: torch.dtype = DT) -> Eagle3Head:
    cfg = Eagle3Config(
        hidden_size=H,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=48,
        vocab_size=V,
        draft_vocab_size=VD,
        aux_layer_ids=(1, 2, 3),
    )
    g = torch.Generator().manual_seed(seed)
    head = Eagle3Head(cfg, torch.randn(V, H, generator=g))
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            else:  # large enough that the logits are far from uniform (no near-ties)
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
        ids = draft_vocab_ids(V, VD, seed)
        head.d2t.copy_(ids - torch.arange(VD))
        head.t2d.zero_().index_fill_(0, ids, True)
    return head.to(dtype)


def draft_id(head: Eagle3Head, target_ids: torch.Tensor) -> torch.Tensor:
    table = torch.full((head.cfg.vocab_size,), -1, dtype=torch.int64)
    table[head.to_target(torch.arange(head.cfg.draft_vocab_size))] = torch.arange(head.cfg.draft_vocab_size)
    out = table[target_ids]
    assert (out >= 0).all()
    return out


@torch.no_grad()
def reference_logps(head: Eagle3Head, feats: torch.Tensor, toks: torch.Tensor, path: list[int]) -> list[torch.Tensor]:
    """Draft-vocab log-probs after the committed pairs and after each token of ``path`` (no cache)."""
    hid = list(head.fuse(feats.to(DT)))
    tk = [int(t) for t in toks]
    out = []
    for j in range(len(path) + 1):
        T = len(tk)
        pr = head.project(torch.stack(hid)[None], torch.tensor([tk]), torch.arange(T)[None])
        causal = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
        logits, h = head.finish(head.attend(pr.q, pr.k, pr.v, causal), pr.residual)
        out.append(torch.log_softmax(logits[0, -1].double(), -1))
        if j < len(path):
            hid.append(h[0, -1])
            tk.append(path[j])
    return out


class History:
    """Random committed tokens/features per request, and the chunks fed to ``catch_up``."""

    def __init__(self, lengths: list[int], seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.toks = [torch.randint(0, V, (n,), generator=g) for n in lengths]
        self.feats = [torch.randn(n, 3 * H, generator=g, dtype=DT) for n in lengths]
        self.g = g

    def extend(self, b: int, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.tensor(tokens, dtype=torch.int64)
        f = torch.randn(len(tokens), 3 * H, generator=self.g, dtype=DT)
        self.toks[b] = torch.cat([self.toks[b], t])
        self.feats[b] = torch.cat([self.feats[b], f])
        return t, f


def nodes_of(trees, b: int) -> list[tuple[list[int], int, float]]:
    """(path tokens above the node, node token, logprob) of every non-root node of request b."""
    t = trees.request(b)
    out = []
    for i in range(1, t.num_nodes):
        path, p = [], int(t.parents[i])
        while p > 0:
            path.append(int(t.tokens[p]))
            p = int(t.parents[p])
        out.append((path[::-1], int(t.tokens[i]), float(t.logprob[i])))
    return out


def check_against_reference(head, hist: History, trees, k: int) -> int:
    checked = 0
    for b in range(trees.batch_size):
        for path, tok, lp in nodes_of(trees, b):
            ref = reference_logps(head, hist.feats[b], hist.toks[b], path)[-1]
            top = head.to_target(ref.topk(k).indices)
            assert tok in top.tolist(), (b, path, tok, top)
            # (the node pool keeps log-probs in float32)
            assert lp == pytest.approx(float(ref[draft_id(head, torch.tensor(tok))]), abs=1e-6)
            checked += 1
    return checked


def roots(hist: History) -> torch.Tensor:
    return torch.stack([t[-1] for t in hist.toks])


# -- 1. consistency with the cache-free recomputation --------------------------------------------
def test_chain_matches_full_recompute_over_rounds():
    head = make_head()
    drafter = Eagle3Drafter(head)
    assert drafter.name == "eagle3" and drafter.captured_layers == (1, 2, 3)
    hist = History([6, 11, 2])
    drafter.start(hist.toks)
    drafter.catch_up(hist.toks, hist.feats)
    for rnd in range(3):
        trees, _ = build_trees(Chain(4), drafter, roots(hist))
        for b in range(3):
            path = [tok for _, tok, _ in nodes_of(trees, b)]
            assert len(path) == 4
            ref = reference_logps(head, hist.feats[b], hist.toks[b], path)
            for d, tok in enumerate(path):  # the chain is the greedy chain of the reference
                assert tok == int(head.to_target(ref[d].argmax()))
                assert float(trees.request(b).logprob[d + 1]) == pytest.approx(float(ref[d].max()), abs=1e-6)
        # Verification: request b accepts (b + rnd) % 3 drafted tokens, then a bonus token.
        new = []
        for b in range(3):
            chain = [tok for _, tok, _ in nodes_of(trees, b)]
            new.append(hist.extend(b, chain[: (b + rnd) % 3] + [int(torch.randint(0, V, (), generator=hist.g))]))
        drafter.catch_up([t for t, _ in new], [f for _, f in new])
        assert drafter.lengths.tolist() == [len(t) for t in hist.toks]


def test_tree_matches_per_path_recompute():
    head = make_head(seed=1)
    drafter = Eagle3Drafter(head)
    hist = History([7, 3], seed=1)
    drafter.start(hist.toks)
    drafter.catch_up(hist.toks, hist.feats)
    for _ in range(2):
        # Beam 2 of 2 children over 3 depths, every candidate kept: the frontier at depth 2 is the
        # best 2 of 4 candidates, in score order, so frontier.source reorders columns.
        trees, _ = build_trees(StaticTree(depth=3, topk=2, total_tokens=100), drafter, roots(hist))
        assert trees.sizes.tolist() == [1 + 2 + 4 + 4] * 2
        assert check_against_reference(head, hist, trees, k=2) == 20
        for b in range(2):
            hist.extend(b, [int(trees.request(b).tokens[1]), 5])
        drafter.catch_up([torch.tensor([int(t[-2]), 5]) for t in hist.toks], [f[-2:] for f in hist.feats])


def test_frontier_plumbing_sources_empty_slots_and_inactive_requests():
    head = make_head(seed=2)
    drafter = Eagle3Drafter(head)
    hist = History([5, 8, 4], seed=2)
    drafter.start(hist.toks)
    drafter.catch_up(hist.toks, hist.feats)
    B = 3
    c1 = drafter.propose(
        Frontier(
            0,
            torch.zeros(B, 1, dtype=torch.int64),
            torch.full((B, 1), -1),
            roots(hist)[:, None],
            torch.zeros(B, 1),
            torch.ones(B, dtype=torch.bool),
        ),
        3,
    )
    assert c1.tokens.shape == (B, 3) and c1.valid.all() and (c1.parent == 0).all()
    # Depth 1: columns (2, 0) then an empty slot; request 1 inactive.
    src = torch.tensor([[2, 0, -1]] * B)
    slots = torch.where(src >= 0, src + 1, -1)
    active = torch.tensor([True, False, True])
    c2 = drafter.propose(
        Frontier(1, slots, src, c1.tokens.gather(1, src.clamp(min=0)) * (src >= 0), torch.zeros(B, 3), active), 2
    )
    assert c2.tokens.shape == (B, 6)
    assert c2.parent[0].tolist() == [0, 0, 1, 1, 2, 2]
    assert c2.valid.tolist() == [[True] * 4 + [False] * 2, [False] * 6, [True] * 4 + [False] * 2]
    # Depth 2: expand candidate 3 (child of column 0) and candidate 0 (child of column 2).
    src3 = torch.tensor([[3, 0]] * B)
    c3 = drafter.propose(Frontier(2, src3 + 10, src3, c2.tokens.gather(1, src3), torch.zeros(B, 2), active), 2)
    for b in (0, 2):
        for f, col in enumerate((3, 0)):
            parent_col = int(src[b, int(c2.parent[b, col])])
            path = [int(c1.tokens[b, parent_col]), int(c2.tokens[b, col])]
            ref = reference_logps(head, hist.feats[b], hist.toks[b], path)
            assert float(c1.logprob[b, parent_col]) == pytest.approx(
                float(ref[0][draft_id(head, torch.tensor(path[0]))]), abs=1e-9
            )
            assert float(c2.logprob[b, col]) == pytest.approx(
                float(ref[1][draft_id(head, torch.tensor(path[1]))]), abs=1e-9
            )
            top, ids = ref[2].topk(2)
            assert c3.tokens[b, 2 * f : 2 * f + 2].tolist() == head.to_target(ids).tolist()
            torch.testing.assert_close(c3.logprob[b, 2 * f : 2 * f + 2].double(), top, atol=1e-9, rtol=0)
    assert not c3.valid[1].any() and c3.valid[[0, 2]].all()
    with pytest.raises(RuntimeError, match="depth"):
        drafter.propose(Frontier(1, slots, src, c1.tokens, torch.zeros(B, 3), active), 2)


# -- 2. batch independence -----------------------------------------------------------------------
def _run(head, hist: History, rows: list[int], rounds: list[list[int]]):
    """Draft a static tree for ``rows`` of ``hist`` (after catch-ups of ``rounds`` extra tokens)."""
    drafter = Eagle3Drafter(head)
    toks, feats = [hist.toks[b] for b in rows], [hist.feats[b] for b in rows]
    drafter.start(toks)
    n0 = [len(t) - sum(r[b] for r in rounds) for t, b in zip(toks, rows)]
    drafter.catch_up([t[:n] for t, n in zip(toks, n0)], [f[:n] for f, n in zip(feats, n0)])
    at = n0
    for r in rounds:
        # A step is drafted (and its state dropped) before every catch-up, as in serving.
        build_trees(
            StaticTree(depth=2, topk=2, total_tokens=6), drafter, torch.stack([t[n - 1] for t, n in zip(toks, at)])
        )
        nxt = [n + r[b] for n, b in zip(at, rows)]
        drafter.catch_up([t[a:n] for t, a, n in zip(toks, at, nxt)], [f[a:n] for f, a, n in zip(feats, at, nxt)])
        at = nxt
    trees, _ = build_trees(StaticTree(depth=3, topk=3, total_tokens=12), drafter, torch.stack([t[-1] for t in toks]))
    return trees


def test_requests_are_independent_of_the_batch():
    head = make_head(seed=3)
    hist = History([4, 17, 9, 5], seed=3)  # first catch-ups of 1, 13, 4 and 1 pairs
    rounds = [[2, 0, 5, 1], [1, 4, 0, 3]]  # ragged catch-ups, some empty ("nothing new")
    batch = _run(head, hist, [0, 1, 2, 3], rounds)
    for b in range(4):
        alone = _run(head, hist, [b], rounds).request(0)
        mine = batch.request(b)
        assert mine.tokens.tolist() == alone.tokens.tolist()
        assert mine.parents.tolist() == alone.parents.tolist()
        torch.testing.assert_close(mine.logprob, alone.logprob, atol=1e-6, rtol=0)
    # And the batched run is what the reference says, request by request.
    assert check_against_reference(head, hist, batch, k=3) == 4 * 11


# -- 3. chunked catch-up -------------------------------------------------------------------------
def test_catch_up_in_chunks_equals_one_chunk():
    head = make_head(seed=4)
    hist = History([12, 7, 9], seed=4)
    one = Eagle3Drafter(head)
    one.start(hist.toks)
    one.catch_up(hist.toks, hist.feats)
    many = Eagle3Drafter(head)
    many.start([t[:1] for t in hist.toks])  # small initial cache: forces reallocations
    cuts = [[0, 1, 5, 5, 12], [0, 0, 6, 7, 7], [0, 2, 3, 8, 9]]
    for i in range(4):
        many.catch_up(
            [t[c[i] : c[i + 1]] for t, c in zip(hist.toks, cuts)],
            [f[c[i] : c[i + 1]] for f, c in zip(hist.feats, cuts)],
        )
    assert many.lengths.tolist() == one.lengths.tolist() == [12, 7, 9]
    torch.testing.assert_close(many.last_logits, one.last_logits, atol=1e-10, rtol=0)
    torch.testing.assert_close(many.last_hidden, one.last_hidden, atol=1e-10, rtol=0)
    for b, n in enumerate([12, 7, 9]):
        torch.testing.assert_close(many.k_cache[b, :, :n], one.k_cache[b, :, :n], atol=1e-10, rtol=0)
        torch.testing.assert_close(many.v_cache[b, :, :n], one.v_cache[b, :, :n], atol=1e-10, rtol=0)
    t1, _ = build_trees(StaticTree(depth=3, topk=2, total_tokens=8), one, roots(hist))
    t2, _ = build_trees(StaticTree(depth=3, topk=2, total_tokens=8), many, roots(hist))
    assert t1.tokens.tolist() == t2.tokens.tolist() and t1.parents.tolist() == t2.parents.tolist()
    torch.testing.assert_close(t1.logprob, t2.logprob, atol=1e-10, rtol=0)


def test_catch_up_rejects_bad_input():
    drafter = Eagle3Drafter(make_head())
    drafter.start([torch.zeros(3)] * 2)
    with pytest.raises(ValueError):
        drafter.catch_up([torch.tensor([1, 2])], [torch.zeros(2, 3 * H)])
    with pytest.raises(ValueError):
        drafter.catch_up([torch.tensor([1, 2]), torch.tensor([3])], None)
    with pytest.raises(ValueError):
        drafter.catch_up([torch.tensor([1, 2]), torch.tensor([3])], [torch.zeros(2, 3 * H), torch.zeros(2, 3 * H)])
    drafter.catch_up(
        [torch.tensor([1, 2]), torch.tensor([], dtype=torch.int64)], [torch.zeros(2, 3 * H), torch.zeros(0, 3 * H)]
    )
    # A request that never committed anything drafts nothing.
    c = drafter.propose(
        Frontier(
            0,
            torch.zeros(2, 1, dtype=torch.int64),
            torch.full((2, 1), -1),
            torch.zeros(2, 1, dtype=torch.int64),
            torch.zeros(2, 1),
            torch.ones(2, dtype=torch.bool),
        ),
        2,
    )
    assert c.valid.tolist() == [[True, True], [False, False]]


# -- 4. checkpoints ------------------------------------------------------------------------------
# What LlamaForCausalLMEagle3.load_weights maps every checkpoint key to (legacy "midlayer" ->
# "layers.0", q/k/v -> qkv_proj and gate/up -> gate_up_proj shards, "model." prefix), and the
# parameters that model has with tie_word_embeddings=False and no fc_norm/input_norm.
SGLANG_PARAMS = {
    "model.fc.weight",
    "model.layers.0.self_attn.qkv_proj.weight",
    "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.mlp.gate_up_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.layers.0.input_layernorm.weight",
    "model.layers.0.hidden_norm.weight",
    "model.layers.0.post_attention_layernorm.weight",
    "model.norm.weight",
    "lm_head.weight",
}


def sglang_param_of(name: str) -> str | None:
    name = name.replace("midlayer", "layers.0")
    if "d2t" in name or "t2d" in name:
        return None  # d2t becomes hot_token_id; t2d is skipped
    for shard, stacked in (
        (".q_proj", ".qkv_proj"),
        (".k_proj", ".qkv_proj"),
        (".v_proj", ".qkv_proj"),
        (".gate_proj", ".gate_up_proj"),
        (".up_proj", ".gate_up_proj"),
    ):
        if shard in name:
            name = name.replace(shard, stacked)
            break
    return name if name == "lm_head.weight" else f"model.{name}"


def _outputs(head: Eagle3Head, hist: History):
    drafter = Eagle3Drafter(head)
    drafter.start(hist.toks)
    drafter.catch_up(hist.toks, [f.to(head.fc.weight.dtype) for f in hist.feats])
    trees, _ = build_trees(StaticTree(depth=3, topk=2, total_tokens=10), drafter, roots(hist))
    return trees


def test_checkpoint_round_trip_in_the_sglang_layout(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    tcfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": V,
        "hidden_size": H,
        "intermediate_size": 48,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
    }
    (target / "config.json").write_text(json.dumps(tcfg))
    tiny = write_tiny_eagle3_draft(tmp_path / "tiny", target, draft_vocab_size=VD, aux_layer_ids=[0, 1, 2]).path
    written = load_file(str(tiny / "model.safetensors"))
    ids = draft_vocab_ids(V, VD)
    assert written.keys() == eagle3_tensors(tcfg, json.loads((tiny / "config.json").read_text()), ids).keys()

    embed = torch.randn(V, H, generator=torch.Generator().manual_seed(5))
    head = Eagle3Head.load(tiny, embed)
    # sglang's ids name captured *outputs* (it captures the inputs of layers id + 1).
    assert head.cfg.aux_layer_ids == (1, 2, 3)
    torch.testing.assert_close(head.d2t, written["d2t"])
    assert head.to_target(torch.arange(VD)).tolist() == ids.tolist()

    head.save(tmp_path / "rt", dtype=torch.float32)
    saved = load_file(str(tmp_path / "rt" / "model.safetensors"))
    assert {k: (tuple(t.shape), t.dtype) for k, t in saved.items()} == {
        k: (tuple(t.shape), t.dtype) for k, t in written.items()
    }
    for k in written:
        assert torch.equal(saved[k], written[k]), k
    assert {sglang_param_of(k) for k in saved} - {None} == SGLANG_PARAMS
    cfg = json.loads((tmp_path / "rt" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["tie_word_embeddings"] is False
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    for key in (
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
        "draft_vocab_size",
        "num_hidden_layers",
        "rms_norm_eps",
        "rope_theta",
    ):
        assert cfg[key] == json.loads((tiny / "config.json").read_text())[key], key

    again = Eagle3Head.load(tmp_path / "rt", embed)
    assert again.cfg == head.cfg
    hist = History([6, 4], seed=5)
    a, b = _outputs(head, hist), _outputs(again, hist)
    assert a.tokens.tolist() == b.tokens.tolist() and torch.equal(a.logprob, b.logprob)

    # The default (bf16) export: same keys and shapes, floats in bf16, ids untouched.
    head.save(tmp_path / "bf16")
    bf = load_file(str(tmp_path / "bf16" / "model.safetensors"))
    assert {k: tuple(t.shape) for k, t in bf.items()} == {k: tuple(t.shape) for k, t in written.items()}
    assert all(
        t.dtype == (written[k].dtype if not written[k].is_floating_point() else torch.bfloat16) for k, t in bf.items()
    )


def test_trained_head_round_trip(tmp_path):
    head = make_head(seed=6, dtype=torch.float32)
    head.save(tmp_path / "h", dtype=torch.float32)
    again = Eagle3Head.load(tmp_path / "h", head.embed)
    assert again.cfg == head.cfg
    for (n1, p1), (n2, p2) in zip(head.state_dict().items(), again.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1
    hist = History([5, 9], seed=6)
    a, b = _outputs(head, hist), _outputs(again, hist)
    assert a.tokens.tolist() == b.tokens.tolist() and torch.equal(a.logprob, b.logprob)
