"""Hybrid drafting (a head and the n-gram drafter in one tree): the head expands n-gram nodes
exactly as it expands its own, duplicates merge, and decoding stays lossless while both drafters'
tokens are accepted."""

from __future__ import annotations

import pytest
import torch

from sglang_echo.core import GatingConfig, PolicyConfig, build_trees, greedy_verify, make_policy
from sglang_echo.core.baselines import StaticTree
from sglang_echo.drafters.eagle3 import Eagle3Drafter
from sglang_echo.drafters.hybrid import HEAD, NGRAM, HybridDrafter

from .test_eagle3 import DT, H, History, V, draft_id, make_head, reference_logps
from .test_ngram import ToyTarget, root_frontier, t


def nodes(trees, b: int):
    """(path above, token, logprob, drafter, drafters of the path) of every non-root node of request b."""
    r = trees.request(b)
    out = []
    for i in range(1, r.num_nodes):
        path, kinds, p = [], [], int(r.parents[i])
        while p > 0:
            path.append(int(r.tokens[p]))
            kinds.append(int(r.drafter[p]))
            p = int(r.parents[p])
        out.append((path[::-1], int(r.tokens[i]), float(r.logprob[i]), int(r.drafter[i]), kinds))
    return out


def periodic_history(lengths: list[int], seed: int) -> History:
    """Random features over text that repeats (period 5), so the n-gram drafter proposes."""
    hist = History(lengths, seed=seed)
    hist.toks = [torch.arange(n) % 5 * 7 + b for b, n in enumerate(lengths)]
    return hist


def started(head, hist: History) -> HybridDrafter:
    """A hybrid whose head holds exactly ``hist``'s pairs (as test_eagle3's drafters do) and whose
    n-gram drafter its text (after the first token, which the head's pairs start from)."""
    drafter = HybridDrafter(Eagle3Drafter(head))
    drafter.start([x[:1] for x in hist.toks])
    drafter.catch_up(hist.toks, hist.feats)
    return drafter


def roots(hist: History) -> torch.Tensor:
    return torch.stack([x[-1] for x in hist.toks])


def test_head_expands_ngram_nodes_as_its_own():
    head = make_head(seed=3)
    hist = periodic_history([13, 9], seed=3)
    drafter = started(head, hist)
    assert drafter.name == "eagle3+ngram" and drafter.captured_layers == (1, 2, 3)
    trees, _ = build_trees(StaticTree(depth=3, topk=2, total_tokens=100), drafter, roots(hist))
    checked = under_ngram = 0
    for b in range(2):
        every = nodes(trees, b)
        for path, tok, lp, kind, above in every:
            if kind == NGRAM:  # only where the head did not propose the same child
                assert tok not in [n[1] for n in every if n[0] == path and n[3] == HEAD]
                continue
            ref = reference_logps(head, hist.feats[b], hist.toks[b], path)[-1]
            assert tok in head.to_target(ref.topk(2).indices).tolist(), (b, path, tok)
            ref_lp = float(ref[draft_id(head, torch.tensor(tok))])
            assert lp >= ref_lp - 1e-6  # an n-gram sibling with the same token may raise it
            if lp == pytest.approx(ref_lp, abs=1e-6) and NGRAM in above:
                under_ngram += 1  # the head's child of an n-gram node, as the reference drafts it
            checked += 1
    assert under_ngram > 0, (checked, under_ngram)


def test_duplicates_merge_into_the_head_node():
    head = make_head(seed=4)
    hist = periodic_history([12], seed=4)
    hybrid = started(head, hist)
    # The head's whole draft vocabulary at depth 1: the n-gram continuation is one of its children.
    k = head.cfg.draft_vocab_size
    trees, _ = build_trees(StaticTree(depth=1, topk=k, total_tokens=k + 1), hybrid, roots(hist))
    r = trees.request(0)
    toks = r.tokens[1:].tolist()
    assert len(toks) == len(set(toks)) == k and (r.drafter[1:] == HEAD).all()
    ngram = hybrid.ngram.propose(root_frontier(1), 1)
    nxt, ngram_lp = int(ngram.tokens[0, 0]), float(ngram.logprob[0, 0])
    assert nxt == int(hist.toks[0][-5])  # what followed the root's last occurrence
    head_lp = float(reference_logps(head, hist.feats[0], hist.toks[0], [])[-1][draft_id(head, torch.tensor(nxt))])
    assert ngram_lp > head_lp  # a long exact match beats a random head
    assert float(r.logprob[1 + toks.index(nxt)]) == pytest.approx(ngram_lp, abs=1e-6)


# The toy target over the head's vocabulary, writing tokens 0..5 only, so its text repeats.
TOY = ToyTarget(vocab=V, out=6, seed=7)


@pytest.mark.parametrize("policy", ["echo", "static-tree", "chain"])
def test_lossless_and_both_drafters_accepted(policy):
    """The toy target decoded with a random EAGLE-3 head plus the n-gram drafter: exactly greedy
    decoding, with accepted n-gram tokens."""
    head = make_head(seed=5)
    prompts = [[1], [2, 3, 4], [0, 5, 1, 2, 3, 4, 5], [4] * 11]
    B, n_new = len(prompts), 40
    cfg = PolicyConfig(k_max=6 * B, max_depth=5, w_def=1, w_max=3, topk=3, total_tokens=12, fixed_tau=0.05)
    pol = make_policy(policy, cfg, GatingConfig((1, 3), (0.1, 0.05)))
    drafter = HybridDrafter(Eagle3Drafter(head))
    g = torch.Generator().manual_seed(5)

    def feats(n: int) -> torch.Tensor:
        return torch.randn(n, 3 * H, generator=g, dtype=DT)

    seqs = [list(p) for p in prompts]
    first = [TOY.next(s) for s in seqs]
    drafter.start([t(p) for p in prompts])
    drafter.catch_up([t(p[1:] + [f]) for p, f in zip(prompts, first)], [feats(len(p)) for p in prompts])
    for s, f in zip(seqs, first):
        s.append(f)
    accepted = {HEAD: 0, NGRAM: 0}
    while min(len(s) - len(p) for s, p in zip(seqs, prompts)) < n_new:
        roots = t([s[-1] for s in seqs])
        trees, _ = build_trees(pol, drafter, roots)
        res = greedy_verify(trees, TOY.tree_argmax(trees, seqs))
        new = [res.new_tokens[b, : int(res.accept_len[b]) + 1].tolist() for b in range(B)]
        for b, x in enumerate(new):
            path = [n for n in nodes(trees, b)]
            for depth in range(len(x) - 1):  # the accepted drafts, by the drafter that proposed them
                prefix = x[:depth]
                kind = next(n[3] for n in path if n[0] == prefix and n[1] == x[depth])
                accepted[kind] += 1
            seqs[b].extend(x)
        drafter.catch_up([t(x) for x in new], [feats(len(x)) for x in new])
    for b, (s, p) in enumerate(zip(seqs, prompts)):
        assert s[len(p) : len(p) + n_new] == TOY.reference(p, n_new), f"request {b} diverged"
    assert accepted[NGRAM] > 0, accepted
