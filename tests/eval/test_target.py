"""HFTarget + the AR loop against HF transformers' own greedy decoding and hidden states."""

from __future__ import annotations

import pytest
import torch

from sglang_echo.eval import HFTarget, autoregressive_generate

PROMPT_LENS = (5, 13, 8, 3)
MAX_NEW = 16


@pytest.fixture(scope="module")
def target(tiny_llama_dir) -> HFTarget:
    return HFTarget.from_pretrained(tiny_llama_dir, captured_layers=(0, 1, 2))


@pytest.fixture(scope="module")
def prompts(target) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, target.config.vocab_size, (n,), generator=g) for n in PROMPT_LENS]


def _hf_greedy(model, prompt: torch.Tensor, max_new: int, eos_id=None) -> list[int]:
    out = model.generate(
        prompt[None],
        attention_mask=torch.ones(1, prompt.numel(), dtype=torch.long),
        max_new_tokens=max_new,
        do_sample=False,
        eos_token_id=eos_id,
        pad_token_id=0,
    )
    return out[0, prompt.numel() :].tolist()


def test_ar_loop_equals_hf_generate(target, prompts):
    target.model.generation_config.eos_token_id = None
    res = autoregressive_generate(target, prompts, MAX_NEW)
    assert res.steps == MAX_NEW - 1
    assert res.mat == 1.0
    for b, p in enumerate(prompts):
        assert res.tokens[b] == _hf_greedy(target.model, p, MAX_NEW), b


def test_ar_loop_stops_at_eos_like_hf(target, prompts):
    target.model.generation_config.eos_token_id = None
    full = autoregressive_generate(target, prompts, MAX_NEW)
    eos = full.tokens[1][6]  # a token request 1 emits mid-way
    res = autoregressive_generate(target, prompts, MAX_NEW, eos_id=eos)
    for b, p in enumerate(prompts):
        ref = full.tokens[b]
        want = ref[: ref.index(eos) + 1] if eos in ref else ref
        assert res.tokens[b] == want
        hf = _hf_greedy(target.model, p, MAX_NEW, eos_id=eos)
        assert hf[: len(want)] == want and all(t == 0 for t in hf[len(want) :])
    assert len(res.tokens[1]) <= 7


def test_prefill_features_are_layer_inputs(target, prompts):
    first, feats = target.prefill(prompts)
    H, L = target.config.hidden_size, target.num_layers
    with torch.no_grad():
        for b, p in enumerate(prompts):
            out = target.model(p[None], output_hidden_states=True)
            hs = out.hidden_states
            f = feats[b]
            assert f.shape == (p.numel(), 3 * H)
            torch.testing.assert_close(f[:, :H], hs[0][0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(f[:, H : 2 * H], hs[1][0], atol=1e-5, rtol=1e-5)
            # layer index L = the last layer's output *before* the final norm (HF's last entry is normed)
            torch.testing.assert_close(target.base.norm(f[:, 2 * H :]), hs[L][0], atol=1e-5, rtol=1e-5)
            assert int(first[b]) == int(out.logits[0, -1].argmax())
    assert target.lens.tolist() == list(PROMPT_LENS)
    assert target.cache_len() == max(PROMPT_LENS)


def test_captured_layers_validated(tiny_llama_dir):
    with pytest.raises(ValueError):
        HFTarget.from_pretrained(tiny_llama_dir, captured_layers=(5,))
