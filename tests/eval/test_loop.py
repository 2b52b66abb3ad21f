"""speculative_generate is lossless for every policy, and budgeted policies keep K_max."""

from __future__ import annotations

import pytest
import torch

from sglang_echo.core.factory import POLICIES, PolicyConfig, make_policy
from sglang_echo.eval import (
    HFTarget,
    autoregressive_generate,
    policy_k_max,
    speculative_generate,
)

from .drafters import ScriptedDrafter

PROMPT_LENS = (6, 14, 9, 3)
ORACLE = (True, False, True, False)
MAX_NEW = 20
CAPTURED = (0, 1)
# Small shapes keep the CPU time low; the static tree keeps EAGLE's 8/10/60 in its own test.
CFG = PolicyConfig(k_max=24, max_depth=5, w_def=1, w_max=3, topk=3, total_tokens=12)


@pytest.fixture(scope="module")
def target(tiny_llama_dir) -> HFTarget:
    return HFTarget.from_pretrained(tiny_llama_dir, captured_layers=CAPTURED)


@pytest.fixture(scope="module")
def prompts(target) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return [torch.randint(0, target.config.vocab_size, (n,), generator=g) for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def ar(target, prompts):
    return autoregressive_generate(target, prompts, MAX_NEW)


def _drafter(target, ar, oracle=ORACLE, seed=0) -> ScriptedDrafter:
    return ScriptedDrafter(ar.tokens, oracle, target.config.vocab_size, CAPTURED, target.feature_dim, seed=seed)


@pytest.mark.parametrize("name", POLICIES)
def test_lossless_for_every_policy(name, target, prompts, ar):
    drafter = _drafter(target, ar)
    res = speculative_generate(target, drafter, make_policy(name, CFG), prompts, MAX_NEW)
    assert res.tokens == ar.tokens
    assert all(len(t) == MAX_NEW for t in res.tokens)
    if name == "ar":
        assert res.mat == 1.0 and res.steps == MAX_NEW - 1
        return
    for b, good in enumerate(ORACLE):
        if good:
            assert res.request_mat(b) > 1.5, (name, b, res.request_mat(b))
    assert res.mat > 1.0
    oracle_steps = sum(int(a[0]) for a in res.active)  # steps request 0 took part in
    assert oracle_steps < MAX_NEW - 1
    assert len(res.draft_s) == len(res.verify_s) == len(res.verified) == res.steps


def test_static_tree_eagle_shape_is_lossless(target, prompts, ar):
    policy = make_policy("static-tree")  # EAGLE-3's 8 steps / top-10 / 60 tokens
    assert policy.name == "static-tree-8x10x60"
    res = speculative_generate(target, _drafter(target, ar), policy, prompts[:3], MAX_NEW)
    assert res.tokens == ar.tokens[:3]
    assert max(res.verified_total) <= 3 * 60
    assert res.request_mat(0) > 1.5


@pytest.mark.parametrize("name", [n for n in POLICIES if make_policy(n).budgeted])
@pytest.mark.parametrize("k_max", [3, 7, 11])
def test_budgeted_policies_keep_k_max(name, k_max, target, prompts, ar):
    policy = make_policy(name, PolicyConfig(k_max=k_max, max_depth=5, w_max=3))
    assert policy.budgeted and policy_k_max(policy) == k_max
    res = speculative_generate(target, _drafter(target, ar), policy, prompts, MAX_NEW)
    assert res.tokens == ar.tokens
    cap = max(k_max, len(prompts))
    assert max(res.verified_total) <= cap
    assert max(res.verified) <= cap
    if k_max <= len(prompts):  # plain decoding: every request verifies only its root
        assert res.mat == 1.0
    else:
        assert res.mat > 1.0
        assert max(res.verified_total) == cap  # the cap binds (oracle requests want more depth)


def test_eos_and_features_and_kv_lengths(target, prompts, ar):
    """Stops at eos like AR; catch-up features equal HF hidden states of the committed sequence;
    the KV cache holds every committed token but the last."""
    eos = ar.tokens[0][9]
    ar_eos = autoregressive_generate(target, prompts, MAX_NEW, eos_id=eos)
    assert len(ar_eos.tokens[0]) <= 10
    drafter = _drafter(target, ar)
    res = speculative_generate(target, drafter, make_policy("echo", CFG), prompts, MAX_NEW, eos_id=eos)
    assert res.tokens == ar_eos.tokens
    # finished requests stop: no stats from them after they finish
    n_steps_active = [sum(int(a[b]) for a in res.active) for b in range(len(prompts))]
    assert n_steps_active[0] < res.steps or all(n == res.steps for n in n_steps_active)
    H = target.config.hidden_size
    for b, p in enumerate(prompts):
        seq = torch.tensor(drafter.hist[b])
        assert seq[: p.numel()].tolist() == p.tolist()
        gen = seq[p.numel() :].tolist()
        assert gen[: len(res.tokens[b])] == res.tokens[b]  # the drafter may hold the overshoot too
        assert int(target.lens[b]) == seq.numel() - 1
        feats = torch.cat(drafter.features[b])
        assert feats.shape == (seq.numel() - 1, 2 * H)
        with torch.no_grad():
            hs = target.model(seq[None, :-1], output_hidden_states=True).hidden_states
        torch.testing.assert_close(feats[:, :H], hs[0][0], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(feats[:, H:], hs[1][0], atol=1e-4, rtol=1e-4)


def test_wrong_drafter_is_still_lossless(target, prompts, ar):
    res = speculative_generate(
        target, _drafter(target, ar, oracle=(False,) * 4, seed=3), make_policy("chain", CFG), prompts, MAX_NEW
    )
    assert res.tokens == ar.tokens


def test_single_token(target, prompts, ar):
    res = speculative_generate(target, _drafter(target, ar), make_policy("echo", CFG), prompts, 1)
    assert res.steps == 0 and res.tokens == [t[:1] for t in ar.tokens]
