"""Model preparation: the prepared SmolLM2 dir behaves exactly like the GGUF it came from."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from sglang_echo.models import cache
from sglang_echo.models.prepare import load_gguf_model, locate_gguf, prepare

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about autumn."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Explain gravity."}],
]


def test_prepare_is_cached_and_instant(smollm2_dir: Path) -> None:
    t0 = time.monotonic()
    res = prepare()
    assert res.cached and res.path == smollm2_dir
    assert time.monotonic() - t0 < 5.0  # converting takes minutes; 5 s leaves room for a loaded CI host
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in cfg
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["dtype"] == "bfloat16"
    assert list(smollm2_dir.glob("*.safetensors"))
    assert (smollm2_dir / "generation_config.json").exists()
    assert "<|im_start|>" in (smollm2_dir / "chat_template.jinja").read_text()


def test_atomic_dir_leaves_nothing_on_failure(tmp_path: Path) -> None:
    final = tmp_path / "m"
    with pytest.raises(RuntimeError):
        with cache.atomic_dir(final, {"fingerprint": "x"}) as tmp:
            (tmp / "half-written").write_text("x")
            raise RuntimeError("boom")
    assert not final.exists()
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def gguf_and_prepared(smollm2_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Load the reference in bf16 through from_pretrained too: a post-hoc `.to(bf16)` would also
    # cast the rotary inv_freq buffer (from_pretrained keeps it fp32) and change the numerics.
    ref, ref_tok = load_gguf_model(locate_gguf(), dtype="bfloat16")
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.bfloat16).eval()
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    return ref, ref_tok, model, tok


def test_weights_identical_to_gguf(gguf_and_prepared) -> None:
    ref, _, model, _ = gguf_and_prepared
    a, b = ref.state_dict(), model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_greedy_generation_matches_gguf(gguf_and_prepared) -> None:
    ref, ref_tok, model, tok = gguf_and_prepared
    for msgs in PROMPTS:
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert text == ref_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = tok(text, return_tensors="pt").input_ids
        assert torch.equal(ids, ref_tok(text, return_tensors="pt").input_ids)
        kw = dict(max_new_tokens=24, do_sample=False, pad_token_id=tok.eos_token_id)
        with torch.no_grad():
            out = model.generate(ids, **kw)
            ref_out = ref.generate(ids, **kw)
        assert torch.equal(out, ref_out), (tok.decode(out[0]), ref_tok.decode(ref_out[0]))
        assert out.shape[1] > ids.shape[1]
