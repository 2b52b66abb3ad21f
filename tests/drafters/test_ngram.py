"""The n-gram (prompt lookup / suffix) drafter: its proposals, and lossless decoding under every policy."""

import math

import pytest
import torch

from sglang_echo.core import POLICIES, Chain, GatingConfig, PolicyConfig, build_trees, greedy_verify, make_policy
from sglang_echo.core.policy import Frontier
from sglang_echo.drafters.ngram import ALPHA, RELIABILITY, NGramDrafter


def t(xs) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


def root_frontier(batch: int) -> Frontier:
    return Frontier(
        depth=0,
        slots=torch.zeros(batch, 1, dtype=torch.int64),
        source=torch.full((batch, 1), -1),
        tokens=torch.zeros(batch, 1, dtype=torch.int64),
        path_score=torch.zeros(batch, 1),
        active=torch.ones(batch, dtype=torch.bool),
    )


def prob(c: int, n: int, m: int) -> float:
    """The module's q(x) = c_x / (n + alpha) * r_m with the default parameters."""
    return c / (n + ALPHA) * RELIABILITY[m - 1]


def start(drafter: NGramDrafter, prompts, first_tokens) -> None:
    """start + the prefill catch-up of the base.py contract: prompt[1:] + [first token]."""
    drafter.start([t(p) for p in prompts])
    drafter.catch_up([t(p[1:] + [f]) for p, f in zip(prompts, first_tokens)], None)


def test_proposals_branches_and_probabilities():
    d = NGramDrafter(max_ngram=4)
    # Request 0: "0 1 2 3" was followed by 4 twice and by 5 once -> two branches, 4 first.
    # Request 1: a periodic text -> one continuation. Request 2: the root never occurred before.
    start(d, [[0, 1, 2, 3, 4, 0, 1, 2, 3, 5, 0, 1, 2, 3, 4, 0, 1, 2], [7, 8, 9, 7, 8], [5, 6]], [3, 9, 7])
    assert d.history(1) == [7, 8, 9, 7, 8, 9]
    c = d.propose(root_frontier(3), k=3)
    assert c.tokens.shape == (3, 3) and c.parent.tolist() == [[0, 0, 0]] * 3
    assert c.valid.tolist() == [[True, True, False], [True, False, False], [False, False, False]]
    assert c.tokens[0, :2].tolist() == [4, 5] and c.tokens[1, 0] == 7
    p = c.logprob.exp()
    assert torch.allclose(p[0, :2], torch.tensor([prob(2, 3, 4), prob(1, 3, 4)]))
    assert math.isclose(p[1, 0].item(), prob(1, 1, 3), rel_tol=1e-5)  # "7 8 9" seen once before
    v = c.valid
    assert ((p > 0) & (p <= 1))[v].all()
    assert (torch.where(v, p, torch.zeros_like(p)).sum(1) <= 1).all()
    # Ties on count go to the most recent occurrence.
    d.start([t([1, 2, 1, 3, 1])])
    c = d.propose(root_frontier(1), k=2)
    assert c.tokens[0].tolist() == [3, 2] and c.valid[0].tolist() == [True, True]
    # A frontier slot of an inactive request gets nothing.
    f = root_frontier(1)
    f.active[:] = False
    assert not d.propose(f, k=2).valid.any()
    # The prefill catch-up repeats prompt[1:] (base.py); anything else is a caller bug.
    d.start([t([1, 2, 3])])
    with pytest.raises(ValueError):
        d.catch_up([t([4])], None)


def test_confidence_parameters():
    """Longer matches are surer (r_m), a custom model is honoured, bad parameters name themselves."""
    assert list(RELIABILITY) == sorted(RELIABILITY)
    d = NGramDrafter(max_ngram=6, alpha=0.5, reliability=(0.2, 0.9))
    assert d.reliability == (0.2, 0.9, 0.9, 0.9, 0.9, 0.9)  # longer matches take the last r_m
    start(d, [[5, 1, 2, 5, 1]], [2])  # "5 1 2" seen once before the root: m = 3, c = n = 1
    p = d.propose(root_frontier(1), k=1).logprob.exp()[0, 0].item()
    assert math.isclose(p, 1 / 1.5 * 0.9, rel_tol=1e-5)
    assert d.describe() != NGramDrafter().describe()  # a calibration file tells them apart
    for bad in ({"alpha": 0.0}, {"reliability": ()}, {"reliability": (0.5, 1.5)}):
        with pytest.raises(ValueError):
            NGramDrafter(**bad)


def test_paths_are_tracked_and_matched_inside_the_draft():
    d = NGramDrafter(max_ngram=4)
    start(d, [[3, 4]], [3])  # history 3 4 3, root 3
    trees, _ = build_trees(Chain(5), d, t([3]))
    assert trees.tokens.tolist() == [3, 4, 3, 4, 3, 4]
    # Depth 3 (context 3 4 3 4 3): the suffix "3 4 3" occurred at the start, followed by the
    # drafted 4; only the scan of the drafted path finds it (the history index has no "3 4 3").
    assert math.isclose(trees.logprob[3].exp().item(), prob(1, 1, 3), rel_tol=1e-5)
    # Nothing repeats: no drafts at all.
    start(d, [[1, 2, 3]], [4])
    trees, state = build_trees(Chain(5), d, t([4]))
    assert trees.num_nodes == 1 and not state.active.any()


# -- lossless decoding against a toy target ---------------------------------------------------
class ToyTarget:
    """A target whose greedy token is a fixed random function of the last two tokens, always below
    ``out`` (so its text repeats), for contexts of tokens below ``vocab``."""

    def __init__(self, vocab: int, out: int, seed: int):
        self.vocab = vocab
        self.table = torch.randint(0, out, (vocab + 1, vocab), generator=torch.Generator().manual_seed(seed)).tolist()

    def next(self, ctx: list[int]) -> int:
        return self.table[ctx[-2] if len(ctx) > 1 else self.vocab][ctx[-1]]

    def reference(self, prompt: list[int], n: int) -> list[int]:
        """Plain greedy decoding: ``n`` tokens after ``prompt``."""
        seq = list(prompt)
        for _ in range(n):
            seq.append(self.next(seq))
        return seq[len(prompt) :]

    def tree_argmax(self, trees, seqs: list[list[int]]) -> torch.Tensor:
        """The target's greedy token after every tree node, given the node's path."""
        pred = []
        for b, seq in enumerate(seqs):
            paths: list[list[int]] = []
            for i in range(int(trees.indptr[b]), int(trees.indptr[b + 1])):
                par = int(trees.parents[i])
                paths.append([] if par < 0 else paths[par] + [int(trees.tokens[i])])
                pred.append(self.next(seq + paths[-1]))
        return t(pred)


TOY = ToyTarget(vocab=6, out=6, seed=0)
target_next, greedy_reference, tree_argmax = TOY.next, TOY.reference, TOY.tree_argmax


@pytest.mark.parametrize("policy", POLICIES)
def test_lossless_and_accepts_drafts_under_every_policy(policy):
    prompts = [[1], [2, 3, 4], [0, 5, 1, 2, 3, 4, 5], [4] * 11, [3, 1, 4, 1, 5, 2, 0, 2, 3, 5, 4, 4, 1, 0]]
    B, n_new = len(prompts), 48
    cfg = PolicyConfig(k_max=6 * B, max_depth=6, w_def=1, w_max=3, topk=3, total_tokens=10, fixed_tau=0.1)
    pol = make_policy(policy, cfg, GatingConfig((1, 3, 5), (0.2, 0.1, 0.05)))
    drafter = NGramDrafter()
    seqs = [list(p) for p in prompts]
    first = [target_next(s) for s in seqs]  # prefill
    start(drafter, prompts, first)
    for s, f in zip(seqs, first):
        s.append(f)
    steps = accepted = 0
    while min(len(s) - len(p) for s, p in zip(seqs, prompts)) < n_new:
        roots = t([s[-1] for s in seqs])
        trees, _ = build_trees(pol, drafter, roots)
        res = greedy_verify(trees, tree_argmax(trees, seqs))
        new = [res.new_tokens[b, : int(res.accept_len[b]) + 1].tolist() for b in range(B)]
        for s, x in zip(seqs, new):
            s.extend(x)
        drafter.catch_up([t(x) for x in new], None)
        steps += 1
        accepted += int(res.accept_len.sum())
    for b, (s, p) in enumerate(zip(seqs, prompts)):
        assert s[len(p) : len(p) + n_new] == greedy_reference(p, n_new), f"request {b} diverged"
        assert drafter.history(b) == s
    if policy != "ar":
        assert accepted / (steps * B) > 1, f"{policy}: mean accepted drafts per step {accepted / (steps * B):.2f}"
