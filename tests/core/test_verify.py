"""Tree verification: greedy against brute force, ragged against padded, and exact sampling."""

import random

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from sglang_echo.core import DETERMINISTIC, DraftTrees, greedy_verify, greedy_verify_padded, pack, stochastic_verify
from sglang_echo.core import verify as verify_module

from .trees import random_trees, request_lists


def planted_predictions(rng, trees, vocab, hit_rate=0.7):
    """Target argmax per node; with probability hit_rate it equals one of the node's children."""
    pred = []
    for i in range(trees.batch_size):
        tokens, parents, _ = request_lists(trees, i)
        for j in range(len(tokens)):
            kids = [tokens[k] for k in range(len(tokens)) if parents[k] == j]
            pred.append(rng.choice(kids) if kids and rng.random() < hit_rate else rng.randrange(vocab))
    return torch.tensor(pred)


def brute_force_greedy(trees, pred):
    """Longest root path whose every node equals the target's argmax at its parent."""
    out = []
    for i in range(trees.batch_size):
        tokens, parents, _ = request_lists(trees, i)
        lo = int(trees.indptr[i])
        best = [0]
        for leaf in range(len(tokens)):
            path = [leaf]
            while parents[path[-1]] >= 0:
                path.append(parents[path[-1]])
            path = path[::-1]
            if all(tokens[b] == int(pred[lo + a]) for a, b in zip(path, path[1:])) and len(path) > len(best):
                best = path
        new = [tokens[j] for j in best[1:]] + [int(pred[lo + best[-1]])]
        out.append((len(best) - 1, [lo + j for j in best], new))
    return out


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**6), batch=st.integers(1, 8), max_nodes=st.integers(1, 30))
def test_greedy_matches_brute_force(seed, batch, max_nodes):
    rng = random.Random(seed)
    trees = random_trees(rng, batch, max_nodes, vocab=12, distinct_siblings=True)
    pred = planted_predictions(rng, trees, 12)
    res = greedy_verify(trees, pred)
    for i, (length, nodes, new) in enumerate(brute_force_greedy(trees, pred)):
        assert int(res.accept_len[i]) == length
        assert res.accepted_nodes[i, : length + 1].tolist() == nodes
        assert (res.accepted_nodes[i, length + 1 :] == -1).all()
        assert res.new_tokens[i, : length + 1].tolist() == new
        assert int(res.bonus[i]) == new[-1]


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**6), batch=st.integers(1, 8), max_nodes=st.integers(1, 30), pad=st.integers(0, 5))
def test_ragged_and_padded_views_verify_alike(seed, batch, max_nodes, pad):
    """Duplicate sibling tokens allowed: both layouts must pick the first matching sibling."""
    rng = random.Random(seed)
    trees = random_trees(rng, batch, max_nodes, vocab=4, distinct_siblings=False)
    pred = planted_predictions(rng, trees, 4)
    packed = pack(trees, torch.zeros(batch, dtype=torch.int64), width=int(trees.sizes.max()) + pad)
    padded_pred = torch.zeros_like(packed.padded.tokens)
    padded_pred[packed.padded.valid] = pred
    a, b = greedy_verify(trees, pred), greedy_verify_padded(packed, padded_pred)
    assert torch.equal(a.accept_len, b.accept_len)
    assert torch.equal(a.accepted_nodes, b.accepted_nodes)
    assert torch.equal(a.new_tokens, b.new_tokens)


def test_greedy_accepts_logits_too():
    trees = random_trees(random.Random(1), 4, 10, vocab=8)
    pred = planted_predictions(random.Random(2), trees, 8)
    logits = torch.nn.functional.one_hot(pred, 8).float()
    assert torch.equal(greedy_verify(trees, logits).new_tokens, greedy_verify(trees, pred).new_tokens)


# --- stochastic verification --------------------------------------------------------------

V = 5
GEN = torch.Generator().manual_seed(1234)
# The target is a Markov chain over V tokens: p(next | last token) = P[last].
P = torch.distributions.Dirichlet(torch.full((V,), 0.8)).sample((V,))
# Two drafters with their own (wrong) next-token distributions.
Q1 = torch.distributions.Dirichlet(torch.full((V,), 0.8)).sample((V,))
Q2 = torch.distributions.Dirichlet(torch.full((V,), 0.8)).sample((V,))


def sample_tree_batch(last: torch.Tensor, gen: torch.Generator) -> tuple[DraftTrees, torch.Tensor]:
    """Per request (root = last token): children a ~ Q1, b ~ Q2, c = argmax Q1 (deterministic);
    under a: a1 ~ Q2 and a2 = argmax Q2; under c: c1 ~ Q1. Returns trees and target probs [N, V]."""
    B = last.numel()
    a = torch.multinomial(Q1[last], 1, generator=gen).squeeze(1)
    b = torch.multinomial(Q2[last], 1, generator=gen).squeeze(1)
    c = Q1[last].argmax(1)
    a1 = torch.multinomial(Q2[a], 1, generator=gen).squeeze(1)
    a2 = Q2[a].argmax(1)
    c1 = torch.multinomial(Q1[c], 1, generator=gen).squeeze(1)
    tokens = torch.stack([last, a, b, c, a1, a2, c1], 1)
    parents = torch.tensor([-1, 0, 0, 0, 1, 1, 3]).repeat(B, 1)
    depth = torch.tensor([0, 1, 1, 1, 2, 2, 2]).repeat(B, 1)
    # Proposal rows: one distribution per (request, sampled node); -1 for picked nodes.
    dists = torch.stack([Q1[last], Q2[last], Q2[a], Q1[c]], 1).reshape(B * 4, V)
    base = torch.arange(B)[:, None] * 4
    D = DETERMINISTIC
    proposal = torch.cat(
        [torch.full((B, 1), D), base + 0, base + 1, torch.full((B, 1), D), base + 2, torch.full((B, 1), D), base + 3], 1
    )
    n = 7 * B
    trees = DraftTrees(
        indptr=torch.arange(B + 1) * 7,
        tokens=tokens.flatten(),
        parents=parents.flatten(),
        depth=depth.flatten(),
        logprob=torch.zeros(n),
        path_score=torch.zeros(n),
        drafter=torch.zeros(n, dtype=torch.int64),
        proposal=proposal.flatten(),
        proposal_dists=dists,
    )
    return trees, P[tokens.flatten()]


def decode_two_tokens(trials: int, seed: int) -> torch.Tensor:
    """Speculatively decode until every trial has two new tokens; returns them [trials, 2]."""
    gen = torch.Generator().manual_seed(seed)
    out = torch.full((trials, 2), -1)
    count = torch.zeros(trials, dtype=torch.int64)
    last = torch.zeros(trials, dtype=torch.int64)  # every trial starts after token 0
    while bool((count < 2).any()):
        todo = (count < 2).nonzero().squeeze(1)
        trees, probs = sample_tree_batch(last[todo], gen)
        res = stochastic_verify(trees, pack(trees, torch.zeros(todo.numel(), dtype=torch.int64)), probs, gen)
        for col in range(res.new_tokens.shape[1]):
            tok = res.new_tokens[:, col]
            put = (tok >= 0) & (count[todo] < 2)
            rows = todo[put]
            out[rows, count[rows]] = tok[put]
            count[rows] += 1
            last[rows] = tok[put]
    return out


def chi_square_pvalue(pairs: torch.Tensor) -> float:
    observed = torch.bincount(pairs[:, 0] * V + pairs[:, 1], minlength=V * V).double()
    expected = (P[0][:, None] * P).flatten().double() * pairs.shape[0]
    keep = expected > 5
    f_obs, f_exp = observed[keep], expected[keep]
    return float(chisquare(f_obs.numpy(), (f_exp / f_exp.sum() * f_obs.sum()).numpy()).pvalue)


def test_stochastic_verification_preserves_the_target_distribution():
    pairs = decode_two_tokens(40_000, seed=7)
    assert chi_square_pvalue(pairs) > 1e-3


def test_the_distribution_test_catches_a_broken_residual(monkeypatch):
    # Skipping the residual update (reusing p after a rejection) over-samples rejected tokens.
    monkeypatch.setattr(verify_module, "residual", lambda p, q: p)
    pairs = decode_two_tokens(40_000, seed=7)
    assert chi_square_pvalue(pairs) < 1e-6


def test_stochastic_with_point_masses_only_matches_greedy_on_one_hot_targets():
    trees = random_trees(random.Random(5), 6, 15, vocab=9)
    pred = planted_predictions(random.Random(6), trees, 9)
    probs = torch.nn.functional.one_hot(pred, 9).float()
    res = stochastic_verify(trees, pack(trees, torch.zeros(6, dtype=torch.int64)), probs)
    assert torch.equal(res.new_tokens, greedy_verify(trees, pred).new_tokens)
