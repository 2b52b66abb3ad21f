"""The recorded trace: structure, the greedy continuation, and the safetensors + JSON round trip."""

from __future__ import annotations

import json

import torch

from sglang_echo.replay.trace import NODE_FIELDS, Trace

from .conftest import BEAMS, DEPTH, MAX_NEW, WIDTH


def test_round_trip(tmp_path, hash_trace):
    st, js = hash_trace.save(tmp_path / "t")
    assert st.suffix == ".safetensors" and js.suffix == ".json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "t.safetensors"]  # never a pickle
    meta = json.loads(js.read_text())
    assert meta["schema"] == "sglang-echo/replay-trace" and meta["width"] == WIDTH and meta["beams"] == list(BEAMS)
    back = Trace.load(tmp_path / "t.json")
    assert back.meta == hash_trace.meta
    for name in (
        "prompt_indptr",
        "prompt_tokens",
        "output_indptr",
        "output_tokens",
        "tree_indptr",
        "node_indptr",
        *NODE_FIELDS,
    ):
        assert torch.equal(getattr(back, name), getattr(hash_trace, name)), name


def test_structure(hash_trace, refs, prompts):
    tr = hash_trace
    assert tr.num_prompts == len(prompts) and tr.num_trees == len(prompts) * (MAX_NEW - 1)
    for p, prompt in enumerate(prompts):
        assert tr.prompt(p).tolist() == prompt.tolist()
        assert tr.output(p).tolist() == refs[tuple(prompt.tolist())]  # greedy, MAX_NEW + DEPTH tokens
        for s in range(MAX_NEW - 1):  # tree (p, s) is rooted at o_s
            t = int(tr.tree_indptr[p]) + s
            assert int(tr.token[tr.node_indptr[t]]) == int(tr.output(p)[s])
    assert int(tr.depth.max()) == DEPTH
    # BFS order with contiguous children: a node's children are first_child .. first_child + n_kept.
    for t in range(0, tr.num_trees, 7):
        lo, hi = int(tr.node_indptr[t]), int(tr.node_indptr[t + 1])
        par, fc, nk = tr.parent[lo:hi], tr.first_child[lo:hi], tr.n_kept[lo:hi]
        assert par[0] == -1 and bool((par[1:] < torch.arange(1, hi - lo)).all())
        for i in range(hi - lo):
            kids = (par == i).nonzero().flatten()
            assert int(nk[i]) == kids.numel()
            if kids.numel():
                assert kids.tolist() == list(range(int(fc[i]), int(fc[i]) + kids.numel()))
                lp = tr.logprob[lo + kids]
                assert bool((lp[:-1] >= lp[1:]).all())  # the drafter's best-first order
        avail = tr.n_avail[lo:hi]
        assert bool((avail[tr.depth[lo:hi] == DEPTH] == -1).all())  # never expanded at the last depth
        assert bool(((avail < 0) | (avail >= nk)).all())


def test_true_path_length(hash_trace):
    tr = hash_trace
    a = tr.true_path_length()
    assert a.shape == (tr.num_trees,) and int(a.max()) > 2  # the hash drafter finds long true paths
    t = int(a.argmax())
    p = int((tr.tree_indptr[1:] <= t).sum())
    s = t - int(tr.tree_indptr[p])
    lo, hi = int(tr.node_indptr[t]), int(tr.node_indptr[t + 1])
    # Walk the recorded tree along the continuation by hand.
    node, n = 0, 0
    while True:
        kids = [lo + i for i in range(hi - lo) if int(tr.parent[lo + i]) == node]
        nxt = [k - lo for k in kids if int(tr.token[k]) == int(tr.output(p)[s + n + 1])]
        if not nxt:
            break
        node, n = nxt[0], n + 1
    assert n == int(a[t])
