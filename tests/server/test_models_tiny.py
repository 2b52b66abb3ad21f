"""Tiny test artefacts and prompt sets (fast, no server)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from sglang_echo.models import prompts
from sglang_echo.models.tiny import write_tiny_eagle3_draft, write_tiny_llama


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def test_tiny_llama_loads_and_generates(tmp_path: Path, smollm2_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    art = write_tiny_llama(tmp_path / "tiny", smollm2_dir)
    tok = AutoTokenizer.from_pretrained(str(art.path))
    model = AutoModelForCausalLM.from_pretrained(str(art.path)).eval()
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    ids = tok(text, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.eos_token_id)
    assert out.shape[1] == ids.shape[1] + 4
    # Idempotent: a second call reuses the dir.
    mtime = (art.path / "model.safetensors").stat().st_mtime_ns
    write_tiny_llama(tmp_path / "tiny", smollm2_dir)
    assert (art.path / "model.safetensors").stat().st_mtime_ns == mtime


def test_tiny_eagle3_layout_matches_sglang(tmp_path: Path, smollm2_dir: Path) -> None:
    """The names/shapes LlamaForCausalLMEagle3.load_weights expects (SpecForge layout)."""
    art = write_tiny_eagle3_draft(tmp_path / "e3", smollm2_dir, draft_vocab_size=1024)
    cfg = art.config
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["tie_word_embeddings"] is False and cfg["num_hidden_layers"] == 1
    H, V, Vd = cfg["hidden_size"], cfg["vocab_size"], cfg["draft_vocab_size"]
    qd = cfg["num_attention_heads"] * cfg["head_dim"]
    kvd = cfg["num_key_value_heads"] * cfg["head_dim"]
    t = _tensors(art.path)
    assert t["fc.weight"].shape == (H, 3 * H)
    assert t["midlayer.self_attn.q_proj.weight"].shape == (qd, 2 * H)
    assert t["midlayer.self_attn.k_proj.weight"].shape == (kvd, 2 * H)
    assert t["midlayer.self_attn.v_proj.weight"].shape == (kvd, 2 * H)
    assert t["midlayer.self_attn.o_proj.weight"].shape == (H, qd)
    assert t["midlayer.hidden_norm.weight"].shape == (H,)
    assert t["norm.weight"].shape == (H,)
    assert t["lm_head.weight"].shape == (Vd, H)
    assert not any("embed_tokens" in k for k in t)  # shared from the target by sglang
    d2t, t2d = t["d2t"], t["t2d"]
    assert d2t.dtype == torch.int64 and d2t.shape == (Vd,)
    assert t2d.dtype == torch.bool and t2d.shape == (V,) and int(t2d.sum()) == Vd
    target_ids = d2t + torch.arange(Vd)  # what sglang computes as hot_token_id
    assert torch.equal(target_ids, t2d.nonzero().flatten())
    assert len(set(d2t.tolist())) > 1  # non-trivial mapping


def test_early_exit_draft_copies_target_head(tmp_path: Path, smollm2_dir: Path) -> None:
    art = write_tiny_eagle3_draft(
        tmp_path / "ee", smollm2_dir, draft_vocab_size=512, init="early_exit", aux_layer_ids=[1, 14, 28]
    )
    assert art.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 28]
    t = _tensors(art.path)
    with safe_open(str(smollm2_dir / "model.safetensors"), "pt") as f:
        emb = f.get_tensor("model.embed_tokens.weight").float()
    ids = t["d2t"] + torch.arange(512)
    assert torch.equal(t["lm_head.weight"], emb[ids])


def test_prompt_sets() -> None:
    sizes = {n: len(prompts.load(n)) for n in prompts.DATASETS}
    assert sizes["chat"] >= 40 and sizes["math"] >= 30 and sizes["summarize"] >= 20
    assert sizes["humaneval"] == 164
    he = prompts.load("humaneval", limit=1)[0]
    assert he.id == "HumanEval/0" and "def " in he.prompt and not he.is_chat
    math = prompts.load("math")
    assert all(p.is_chat and isinstance(p.meta["answer"], int) for p in math)
    ids = [p.id for p in prompts.load_mixed(3)]
    assert len(ids) == len(set(ids)) == 12
    for line in (prompts.prompts_dir() / "chat_dev.jsonl").read_text().splitlines():
        json.loads(line)
