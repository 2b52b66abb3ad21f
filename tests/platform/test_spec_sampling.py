"""Sampled (temperature > 0) speculative verify on CPU: `ops.spec_sampling` and its wiring.

* `tree_speculative_sampling_target_only` against a loop transcription of the CUDA kernel
  (sglang/kernels/jit/include/sgl_kernel/speculative/sampling.cuh), on random trees with
  random sibling order and duplicate sibling tokens;
* one-hot targets: identical to greedy verify (`verify_tree_greedy_cpu`);
* distribution: the tokens one verify step commits (accepted drafts, then the bonus) follow
  the target exactly (chi-square, fixed seed), and the same statistic rejects the broken
  verifiers we must catch (greedy, accept-the-draft, the kernel's double count of a repeated
  sibling);
* top-k / top-p renormalisation against per-row loops;
* the plugin: in a CPU-engine process sglang's own `_verify_uses_greedy` no longer forces
  greedy for sampled batches, and `eagle_utils` has the ops.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from collections import Counter

import pytest
import torch
from scipy.stats import chi2

from sglang_echo.platform import ops
from sglang_echo.platform.ops.spec_sampling import (
    top_k_renorm_prob,
    top_p_renorm_prob,
    tree_speculative_sampling_target_only,
)

SEEDS = range(6)
ALPHA = 1e-3  # chi-square rejection level (fixed seeds: the outcome is deterministic)


# -- references ---------------------------------------------------------------------------------
def ref_sampling(
    predicts,
    accept_index,
    accept_token_num,
    candidates,
    r_idx,
    r_next,
    r_sib,
    coins,
    final_coins,
    target_probs,
    draft_probs,
    threshold_single=1.0,
    threshold_acc=1.0,
    subtract_draft=True,
):
    """The CUDA kernel line by line, one request at a time. ``subtract_draft=False`` is the
    kernel verbatim; True reads a child's mass as p - draft (our one documented change)."""
    bs, n = candidates.shape
    num_spec = accept_index.shape[1]
    vocab = target_probs.shape[-1]
    t_acc = max(threshold_acc, 1e-9)
    pred = predicts.reshape(-1)
    tp = target_probs.reshape(bs, n, vocab)
    dp = draft_probs.reshape(bs, n, vocab)
    for bx in range(bs):
        prob_acc = torch.zeros((), dtype=torch.float32)
        row = 0
        coin = coins[bx, 0]
        last = int(r_idx[bx, 0])
        accept_index[bx, 0] = last
        num = 0
        cur = 0
        for _j in range(1, num_spec):
            cur = int(r_next[bx, cur])
            while cur != -1:
                tok = int(candidates[bx, cur])
                single = tp[bx, row, tok]
                if subtract_draft:
                    single = (single - dp[bx, row, tok]).clamp_min(0)
                prob_acc = prob_acc + single
                if single > 0 and (coin < prob_acc / t_acc or single >= threshold_single):
                    prob_acc = torch.zeros((), dtype=torch.float32)
                    row = cur
                    coin = coins[bx, cur]
                    pred[last] = tok
                    num += 1
                    accept_index[bx, num] = int(r_idx[bx, cur])
                    last = int(r_idx[bx, cur])
                    break
                dp[bx, row, tok] = tp[bx, row, tok]
                cur = int(r_sib[bx, cur])
            if cur == -1:
                break
        accept_token_num[bx] = num
        q = tp[bx, row].double()
        if num != num_spec - 1:
            q = (q - dp[bx, row].double()).clamp_min(0)
        u = float(final_coins[bx]) * float(q.sum())
        run, sampled, last_valid = 0.0, vocab, -1
        for i in range(vocab):
            if q[i] > 0:
                last_valid = i
                run += float(q[i])
                if run > u and sampled == vocab:
                    sampled = i
        if sampled == vocab:
            sampled = last_valid if last_valid != -1 else vocab - 1
        pred[last] = sampled


def random_links(g: torch.Generator, bs: int, n: int):
    """retrive_* arrays of random trees (node i's parent is a random earlier node), sibling
    lists in random order, flat retrive_index = b * n + i."""
    nxt = torch.full((bs, n), -1, dtype=torch.int64)
    sib = torch.full((bs, n), -1, dtype=torch.int64)
    for b in range(bs):
        kids: dict[int, list[int]] = {}
        for i in range(1, n):
            kids.setdefault(int(torch.randint(0, i, (1,), generator=g)), []).append(i)
        for p, ks in kids.items():
            ks = [ks[j] for j in torch.randperm(len(ks), generator=g).tolist()]
            nxt[b, p] = ks[0]
            for a, c in zip(ks, ks[1:]):
                sib[b, a] = c
    return torch.arange(bs * n).view(bs, n), nxt, sib


def random_probs(g: torch.Generator, *shape: int, zero_frac: float = 0.3) -> torch.Tensor:
    p = torch.rand(*shape, generator=g) ** 2
    p = p * (torch.rand(*shape, generator=g) > zero_frac)
    p[..., 0] += 1e-3  # never an all-zero row
    return (p / p.sum(-1, keepdim=True)).float()


def outputs(bs: int, n: int, num_spec: int, vocab: int):
    return (
        torch.full((bs * n,), -3, dtype=torch.int32),
        torch.full((bs, num_spec), -1, dtype=torch.int32),
        torch.full((bs,), -7, dtype=torch.int32),
        torch.zeros(bs, n, vocab, dtype=torch.float32),
    )


# -- exactness against the kernel transcription ---------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("num_spec", [2, 4, 9])
@pytest.mark.parametrize("thresholds", [(1.0, 1.0), (0.4, 0.6)])
def test_matches_kernel_transcription(seed: int, num_spec: int, thresholds) -> None:
    g = torch.Generator().manual_seed(seed)
    bs, n, vocab = 5, 8, 4  # tiny vocab: duplicate siblings, tokens with zero target mass
    ridx, rnext, rsib = random_links(g, bs, n)
    cand = torch.randint(0, vocab, (bs, n), generator=g)
    target = random_probs(g, bs, n, vocab)
    coins = torch.rand(bs, n, generator=g)
    final = torch.rand(bs, generator=g)
    res = []
    for fn in (tree_speculative_sampling_target_only, ref_sampling):
        pred, acc_idx, acc_num, draft = outputs(bs, n, num_spec, vocab)
        fn(
            pred,
            acc_idx,
            acc_num,
            cand,
            ridx,
            rnext,
            rsib,
            coins,
            final,
            target,
            draft,
            threshold_single=thresholds[0],
            threshold_acc=thresholds[1],
        )
        res.append((pred, acc_idx, acc_num, draft))
    for a, b in zip(*res):
        assert torch.equal(a, b)


def test_signature_matches_sglang_wrapper() -> None:
    from sglang.kernels.ops.speculative.sampling import tree_speculative_sampling_target_only as cuda_op

    assert list(inspect.signature(tree_speculative_sampling_target_only).parameters) == list(
        inspect.signature(cuda_op).parameters
    )
    assert ops.tree_speculative_sampling_target_only is tree_speculative_sampling_target_only


@pytest.mark.parametrize("seed", SEEDS)
def test_one_hot_target_is_greedy_verify(seed: int) -> None:
    g = torch.Generator().manual_seed(50 + seed)
    bs, n, num_spec, vocab = 6, 10, 5, 3
    ridx, rnext, rsib = random_links(g, bs, n)
    cand = torch.randint(0, vocab, (bs, n), generator=g)
    argmax = torch.randint(0, vocab, (bs, n), generator=g)
    onehot = torch.nn.functional.one_hot(argmax, vocab).float()
    pred_s, idx_s, num_s, draft = outputs(bs, n, num_spec, vocab)
    tree_speculative_sampling_target_only(
        pred_s,
        idx_s,
        num_s,
        cand,
        ridx,
        rnext,
        rsib,
        torch.rand(bs, n, generator=g),
        torch.rand(bs, generator=g),
        onehot,
        draft,
    )
    pred_g, idx_g, num_g, _ = outputs(bs, n, num_spec, vocab)
    ops.verify_tree_greedy_cpu(pred_g, idx_g, num_g, cand, ridx, rnext, rsib, argmax)
    assert torch.equal(num_s, num_g) and torch.equal(idx_s, idx_g) and torch.equal(pred_s, pred_g)


# -- distribution ---------------------------------------------------------------------------------
# One request's tree, repeated over TRIALS rows (one verify step each, independent coins).
# Node: (parent, token). Root children 2, 5, 2 (a repeated token), node 1 -> (0, 7), node 4 -> 3.
TREE = [(-1, 4), (0, 2), (0, 5), (0, 2), (1, 0), (1, 7), (4, 3)]
VOCAB, NUM_SPEC, TRIALS = 8, 4, 40_000


def _tree_links():
    n = len(TREE)
    nxt, sib = [-1] * n, [-1] * n
    last_child: dict[int, int] = {}
    for i, (p, _t) in enumerate(TREE):
        if p < 0:
            continue
        if p in last_child:
            sib[last_child[p]] = i
        else:
            nxt[p] = i
        last_child[p] = i
    return torch.tensor(nxt), torch.tensor(sib), torch.tensor([t for _p, t in TREE])


def _target_rows(g: torch.Generator) -> torch.Tensor:
    p = random_probs(g, len(TREE), VOCAB, zero_frac=0.2)
    p[0] = torch.tensor([0.05, 0.05, 0.2, 0.1, 0.1, 0.25, 0.0, 0.25])  # token 2 has 0.2 at the root
    return p


def exact_step_distribution(p: torch.Tensor) -> dict[tuple[int, ...], float]:
    """P(committed tokens of one step): at node v draw x ~ p_v; if x is v's (first) child
    token and fewer than NUM_SPEC - 1 drafts are accepted, move there, else x is the bonus."""
    nxt, sib, tok = _tree_links()
    out: dict[tuple[int, ...], float] = {}

    def walk(v: int, depth: int, prefix: tuple[int, ...], prob: float) -> None:
        child: dict[int, int] = {}
        c = int(nxt[v]) if depth < NUM_SPEC - 1 else -1
        while c != -1:
            child.setdefault(int(tok[c]), c)
            c = int(sib[c])
        for x in range(VOCAB):
            px = prob * float(p[v, x])
            if px == 0:
                continue
            if x in child:
                walk(child[x], depth + 1, prefix + (x,), px)
            else:
                out[prefix + (x,)] = out.get(prefix + (x,), 0.0) + px

    walk(0, 0, (), 1.0)
    return out


def chi_square(samples: list[tuple[int, ...]], probs: dict[tuple[int, ...], float], min_expected: float = 5.0):
    """Pearson statistic and p-value; categories with expected < min_expected are pooled, and
    a sample outside ``probs`` (probability 0) lands in the pooled cell."""
    n = len(samples)
    counts = Counter(samples)
    cells = [k for k, q in probs.items() if q * n >= min_expected]
    obs = [counts.get(k, 0) for k in cells]
    exp = [probs[k] * n for k in cells]
    rest_obs, rest_exp = n - sum(obs), n * (1.0 - sum(probs[k] for k in cells))
    if rest_exp > 1e-9 or rest_obs:
        obs.append(rest_obs)
        exp.append(max(rest_exp, 1e-9))
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    return stat, float(chi2.sf(stat, len(obs) - 1)), len(obs) - 1


def _run(p: torch.Tensor, g: torch.Generator) -> list[tuple[int, ...]]:
    """TRIALS independent verify steps of the fixed tree; each row's committed tokens."""
    nxt, sib, tok = _tree_links()
    n = len(TREE)
    B = TRIALS
    pred, acc_idx, acc_num, draft = outputs(B, n, NUM_SPEC, VOCAB)
    tree_speculative_sampling_target_only(
        pred,
        acc_idx,
        acc_num,
        tok.expand(B, n),
        torch.arange(B * n).view(B, n),
        nxt.expand(B, n),
        sib.expand(B, n),
        torch.rand(B, n, generator=g),
        torch.rand(B, generator=g),
        p.expand(B, n, VOCAB).contiguous(),
        draft,
    )
    committed = torch.where(acc_idx >= 0, pred.long()[acc_idx.long().clamp(min=0)], -1)
    return [tuple(r[: int(k) + 1]) for r, k in zip(committed.tolist(), acc_num.tolist())]


def test_committed_tokens_follow_the_target() -> None:
    g = torch.Generator().manual_seed(1234)
    p = _target_rows(g)
    exact = exact_step_distribution(p)
    assert abs(sum(exact.values()) - 1) < 1e-6
    samples = _run(p, g)
    stat, pval, dof = chi_square(samples, exact)
    print(f"\n[spec_sampling] joint chi2={stat:.1f} dof={dof} p={pval:.3f}")
    assert pval > ALPHA
    # First committed token alone (the root's distribution) and the depth reached.
    first = [s[:1] for s in samples]
    stat1, p1, dof1 = chi_square(first, {(x,): float(p[0, x]) for x in range(VOCAB)})
    print(f"[spec_sampling] first-token chi2={stat1:.1f} dof={dof1} p={p1:.3f}")
    assert p1 > ALPHA
    assert max(len(s) for s in samples) == NUM_SPEC  # full-depth paths (bonus from the plain target) occur


def test_the_statistic_rejects_broken_verifiers() -> None:
    """The same check fails for: greedy verify, always accepting the first draft, and the CUDA
    kernel's rule verbatim (the repeated root child 2 is accepted with 2 p(2))."""
    g = torch.Generator().manual_seed(99)
    p = _target_rows(g)
    first_exact = {(x,): float(p[0, x]) for x in range(VOCAB)}
    B = TRIALS
    greedy = [(int(p[0].argmax()),)] * B
    always_draft = [(int(TREE[1][1]),)] * B
    # The kernel verbatim, first committed token: one coin against cumulative masses 2, 5, 2.
    u = torch.rand(B, generator=g, dtype=torch.float64)
    cums = torch.cumsum(p[0, [2, 5, 2]].double(), 0)
    resid = p[0].double().clone()
    resid[[2, 5]] = 0
    bonus = torch.multinomial(resid, B, replacement=True, generator=g)
    pick = (u[:, None] < cums[None, :]).double().argmax(1)
    verbatim_tok = torch.where(u < cums[-1], torch.tensor([2, 5, 2])[pick], bonus)
    verbatim = [(int(t),) for t in verbatim_tok]
    for name, s in (("greedy", greedy), ("always-draft", always_draft), ("kernel-verbatim", verbatim)):
        stat, pval, _ = chi_square(s, first_exact)
        print(f"[spec_sampling] {name}: chi2={stat:.0f} p={pval:.2g}")
        assert pval < ALPHA, name


# -- top-k / top-p renorm ---------------------------------------------------------------------------
# Without ties the kept sets are those of sglang's CPU sampler (`top_k_top_p_min_p_sampling_from_probs_torch`:
# sort descending; keep rank < k; keep a token iff the mass strictly before it is <= top_p), so a
# speculative server keeps the same tokens as the no-speculation one. Ties at the k-th place are
# all kept (flashinfer's pivot rule, what sglang's GPU verify uses).
def _ref_kept(p: torch.Tensor, k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    out = torch.zeros_like(p)
    for r in range(p.shape[0]):
        order = sorted(range(p.shape[1]), key=lambda i: -float(p[r, i]))
        before = 0.0
        for rank, i in enumerate(order):
            if (k is None or rank < k) and (top_p is None or before <= top_p):
                out[r, i] = p[r, i]
            before += float(p[r, i])
        out[r] /= out[r].sum()
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_top_k_renorm(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    p = random_probs(g, 6, 16, zero_frac=0.0)
    ks = [1, 2, 5, 16, 1 << 30, 3]  # 1 << 30 = sglang's TOP_K_ALL
    got = top_k_renorm_prob(p, torch.tensor(ks))
    want = torch.cat([_ref_kept(p[r : r + 1], k=k) for r, k in enumerate(ks)])
    assert torch.allclose(got, want, atol=1e-6)
    assert torch.allclose(top_k_renorm_prob(p, 1 << 30), p, atol=1e-6)
    tied = torch.tensor([[0.3, 0.2, 0.2, 0.2, 0.1]])
    assert torch.allclose(top_k_renorm_prob(tied, 2), torch.tensor([[1 / 3, 2 / 9, 2 / 9, 2 / 9, 0.0]]))


@pytest.mark.parametrize("seed", SEEDS)
def test_top_p_renorm(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    p = random_probs(g, 6, 16)
    ps = [0.1, 0.5, 0.9, 1.0, 0.75, 0.3]
    got = top_p_renorm_prob(p, torch.tensor(ps))
    want = torch.cat([_ref_kept(p[r : r + 1], top_p=t) for r, t in enumerate(ps)])
    assert torch.allclose(got, want, atol=1e-6)


# -- the plugin, in a CPU-engine process --------------------------------------------------------
PLUGIN_PROBE = """
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.speculative import eagle_utils as e
from sglang_echo.platform.ops import spec_sampling as s
kw = dict(is_cpu=True, is_hip=False, is_xpu=False, use_rejection_sampling=False)
print("sampled", e._verify_uses_greedy(is_all_greedy=False, **kw))
print("greedy", e._verify_uses_greedy(is_all_greedy=True, **kw))
print("ops", e.tree_speculative_sampling_target_only is s.tree_speculative_sampling_target_only,
      e.top_k_renorm_prob is s.top_k_renorm_prob, e.top_p_renorm_prob is s.top_p_renorm_prob)
import sglang.kernels.ops.sampling.renorm as r
print("source_untouched", r.top_k_renorm_prob is None)
"""


def test_plugin_makes_cpu_verify_sample() -> None:
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1"}
    r = subprocess.run([sys.executable, "-c", PLUGIN_PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    assert lines["sampled"] == "False"  # was True: `is_cpu` forced greedy
    assert lines["greedy"] == "True"
    assert lines["ops"] == "True True True"
    assert lines["source_untouched"] == "True"
