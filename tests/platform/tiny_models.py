"""Tiny random-init checkpoints for the platform tests (not the production model preparation).

`make_tiny_llama` writes a small `LlamaForCausalLM` (safetensors + tokenizer + chat template);
`make_tiny_eagle3_head` writes a random EAGLE-3 draft head in SpecForge layout
(`LlamaForCausalLMEagle3`: fc, midlayer.*, norm, lm_head, d2t, t2d).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _build_tokenizer(out: Path) -> None:
    """A byte-level BPE trained on a tiny corpus, so the tests need no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=1000, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ["The quick brown fox jumps over the lazy dog. " * 4,
              "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
              "SGLang serves language models anywhere, even on a plain CPU."] * 20
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
        pad_token="<|endoftext|>", unk_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def make_tiny_llama(out: Path, hidden: int = 64, layers: int = 2, seed: int = 0) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _build_tokenizer(out)
    tok = AutoTokenizer.from_pretrained(out)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=2048, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    # Larger-than-default init makes greedy outputs vary with the prompt (more telling tests).
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    model.save_pretrained(out, safe_serialization=True)
    return out


def make_tiny_eagle3_head(out: Path, target: Path, seed: int = 1, draft_vocab: int | None = None) -> Path:
    """Random EAGLE-3 head for `target` in SpecForge's checkpoint layout."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tcfg = json.loads((Path(target) / "config.json").read_text())
    h, v = tcfg["hidden_size"], tcfg["vocab_size"]
    dv = draft_vocab or v
    nh, kv = tcfg["num_attention_heads"], tcfg["num_key_value_heads"]
    hd = h // nh
    inter = tcfg["intermediate_size"]
    cfg = dict(tcfg)
    cfg.update(architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1,
               draft_vocab_size=dv, target_hidden_size=h)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.1).contiguous()

    sel = torch.sort(torch.randperm(v, generator=g)[:dv]).values
    w = {
        "fc.weight": rnd(h, 3 * h),
        "midlayer.input_layernorm.weight": torch.ones(h),
        "midlayer.hidden_norm.weight": torch.ones(h),
        "midlayer.post_attention_layernorm.weight": torch.ones(h),
        "midlayer.self_attn.q_proj.weight": rnd(nh * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": rnd(kv * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": rnd(kv * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": rnd(h, nh * hd),
        "midlayer.mlp.gate_proj.weight": rnd(inter, h),
        "midlayer.mlp.up_proj.weight": rnd(inter, h),
        "midlayer.mlp.down_proj.weight": rnd(h, inter),
        "norm.weight": torch.ones(h),
        "lm_head.weight": rnd(dv, h),
        # d2t[i] = target_id(i) - i  (SpecForge convention); t2d marks target ids in the draft vocab.
        "d2t": (sel - torch.arange(dv)).to(torch.int64),
        "t2d": torch.zeros(v, dtype=torch.bool).index_fill_(0, sel, True),
    }
    save_file(w, str(out / "model.safetensors"))
    return out


if __name__ == "__main__":
    import sys

    root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/echo_tiny")
    t = make_tiny_llama(root / "llama")
    make_tiny_eagle3_head(root / "eagle3", t)
    print(root)
