"""Writers for tiny random-init test artefacts (safetensors only).

* `write_tiny_llama`: a 2-layer Llama target that shares SmolLM2's tokenizer/chat template, so
  it can stand in for the real target where only plumbing is tested.
* `write_tiny_eagle3_draft`: a one-layer EAGLE-3 draft head in the SpecForge layout that
  `sglang/srt/models/llama_eagle3.py::LlamaForCausalLMEagle3.load_weights` reads:
    fc.weight [H, 3H] | midlayer.* (q/k/v take 2H) | norm.weight | lm_head.weight [Vd, H]
    d2t int64 [Vd]  (target_id = draft_id + d2t[draft_id]) | t2d bool [V]
  The embedding is NOT stored: sglang's EAGLE worker shares the target's embed_tokens with the
  draft (`set_embed`), so a draft never needs its own.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # torch is imported lazily so that importing this module stays cheap
    import torch

from sglang_echo.models.cache import atomic_dir, is_fresh, locked

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)
DraftInit = Literal["random", "early_exit"]


@dataclass(frozen=True)
class TinyArtefact:
    path: Path
    config: dict[str, Any]


def _load_config(model_dir: Path) -> dict[str, Any]:
    return json.loads((Path(model_dir) / "config.json").read_text())


def copy_tokenizer(src: Path, dst: Path) -> None:
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)


def _save(tensors: dict, path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def write_tiny_llama(
    out: Path,
    tokenizer_dir: Path,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 2048,
    dtype: str = "float32",
    seed: int = 0,
) -> TinyArtefact:
    """A tiny random Llama using the tokenizer (and its vocab size) from `tokenizer_dir`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    src_cfg = _load_config(tokenizer_dir)
    cfg = dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        vocab_size=src_cfg["vocab_size"],
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        hidden_act="silu",
        tie_word_embeddings=False,
        bos_token_id=src_cfg.get("bos_token_id"),
        eos_token_id=src_cfg.get("eos_token_id"),
        pad_token_id=src_cfg.get("pad_token_id"),
        dtype=dtype,
    )
    out = Path(out)
    fp = json.dumps({"kind": "tiny_llama", "cfg": cfg, "seed": seed}, sort_keys=True)
    with locked(out):
        if not is_fresh(out, fp):
            with atomic_dir(out, {"fingerprint": fp}) as tmp:
                torch.manual_seed(seed)
                model = LlamaForCausalLM(LlamaConfig(**cfg)).to(getattr(torch, dtype))
                model.save_pretrained(str(tmp), safe_serialization=True)
                copy_tokenizer(Path(tokenizer_dir), tmp)
    return TinyArtefact(out, _load_config(out))


def draft_vocab_ids(vocab_size: int, draft_vocab_size: int, seed: int = 0) -> torch.Tensor:
    """Sorted target ids making up the draft vocab.

    Half are the lowest ids (special tokens and the most common BPE merges sit there), half a
    seeded random sample of the rest, so d2t has non-trivial, non-constant offsets and a wrong
    mapping shows up in tests instead of silently working.
    """
    import torch

    if not 0 < draft_vocab_size <= vocab_size:
        raise ValueError(f"draft_vocab_size must be in (0, {vocab_size}], got {draft_vocab_size}")
    head = draft_vocab_size // 2
    g = torch.Generator().manual_seed(seed)
    rest = torch.randperm(vocab_size - head, generator=g)[: draft_vocab_size - head] + head
    return torch.cat([torch.arange(head), rest]).sort().values


def eagle3_tensors(
    target_cfg: dict[str, Any],
    draft_cfg: dict[str, Any],
    ids: torch.Tensor,
    init: DraftInit = "random",
    target_weights: dict | None = None,
    seed: int = 0,
) -> dict:
    """The state dict of an EAGLE-3 head (SpecForge names), fp32."""
    import torch

    g = torch.Generator().manual_seed(seed)
    H = draft_cfg["hidden_size"]
    nh, nkv, hd = (draft_cfg[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim"))
    inter = draft_cfg["intermediate_size"]
    V, Vd = target_cfg["vocab_size"], draft_cfg["draft_vocab_size"]

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.02

    t = {
        "fc.weight": rnd(H, 3 * H),
        # The first (only) layer concatenates [norm(embeds), norm(hidden)] -> 2H inputs.
        "midlayer.self_attn.q_proj.weight": rnd(nh * hd, 2 * H),
        "midlayer.self_attn.k_proj.weight": rnd(nkv * hd, 2 * H),
        "midlayer.self_attn.v_proj.weight": rnd(nkv * hd, 2 * H),
        "midlayer.self_attn.o_proj.weight": rnd(H, nh * hd),
        "midlayer.mlp.gate_proj.weight": rnd(inter, H),
        "midlayer.mlp.up_proj.weight": rnd(inter, H),
        "midlayer.mlp.down_proj.weight": rnd(H, inter),
        "midlayer.input_layernorm.weight": torch.ones(H),
        "midlayer.hidden_norm.weight": torch.ones(H),
        "midlayer.post_attention_layernorm.weight": torch.ones(H),
        "norm.weight": torch.ones(H),
        "lm_head.weight": rnd(Vd, H),
        "d2t": (ids - torch.arange(Vd)).to(torch.int64),
        "t2d": torch.zeros(V, dtype=torch.bool).index_fill_(0, ids, True),
    }
    if init == "early_exit":
        # Why: a purely random head is (almost) never accepted, so only the reject path of
        # verification gets exercised. Here fc passes the deepest captured target hidden state
        # through unchanged, the layer's output projections are zeroed (residual passes
        # through), and norm/lm_head are the target's: the draft becomes an "early exit" of the
        # target and gets a fair share of tokens accepted. Midlayer q/k/v/gate/up stay random.
        assert target_weights is not None and H == target_cfg["hidden_size"]
        fc = torch.zeros(H, 3 * H)
        fc[:, 2 * H :] = torch.eye(H)
        t["fc.weight"] = fc
        t["midlayer.self_attn.o_proj.weight"].zero_()
        t["midlayer.mlp.down_proj.weight"].zero_()
        t["norm.weight"] = target_weights["model.norm.weight"].float().clone()
        head = target_weights.get("lm_head.weight", target_weights["model.embed_tokens.weight"])
        t["lm_head.weight"] = head.float()[ids].clone()
    return t


def write_tiny_eagle3_draft(
    out: Path,
    target_dir: Path,
    *,
    draft_vocab_size: int = 4096,
    intermediate_size: int | None = None,
    init: DraftInit = "random",
    aux_layer_ids: list[int] | None = None,
    dtype: str = "float32",
    seed: int = 0,
) -> TinyArtefact:
    """A one-layer random EAGLE-3 head for the target in `target_dir` (hidden sizes must match).

    `aux_layer_ids` become `eagle_config.eagle_aux_hidden_state_layer_ids` (sglang captures the
    *outputs* of these target layers); default: sglang's own default, i.e. none written.
    """
    import torch

    target_dir = Path(target_dir)
    tcfg = _load_config(target_dir)
    H = tcfg["hidden_size"]
    nh = tcfg["num_attention_heads"]
    cfg: dict[str, Any] = dict(
        architectures=["LlamaForCausalLMEagle3"],
        model_type="llama",
        hidden_size=H,
        # Same attention geometry as the target keeps the draft KV pool/backends on the same
        # code paths as the target.
        num_attention_heads=nh,
        num_key_value_heads=tcfg.get("num_key_value_heads", nh),
        head_dim=tcfg.get("head_dim", H // nh),
        intermediate_size=intermediate_size or tcfg["intermediate_size"],
        num_hidden_layers=1,
        hidden_act="silu",
        rms_norm_eps=tcfg.get("rms_norm_eps", 1e-5),
        max_position_embeddings=tcfg["max_position_embeddings"],
        rope_theta=(tcfg.get("rope_parameters") or {}).get("rope_theta", tcfg.get("rope_theta", 10000.0)),
        vocab_size=tcfg["vocab_size"],
        draft_vocab_size=draft_vocab_size,
        # Must be False: with True sglang would use embed_tokens as lm_head (no draft vocab).
        tie_word_embeddings=False,
        bos_token_id=tcfg.get("bos_token_id"),
        eos_token_id=tcfg.get("eos_token_id"),
        pad_token_id=tcfg.get("pad_token_id"),
        dtype=dtype,
    )
    if aux_layer_ids is not None:
        cfg["eagle_config"] = {
            "eagle_aux_hidden_state_layer_ids": list(aux_layer_ids),
            "use_aux_hidden_state": True,
        }
    out = Path(out)
    fp = json.dumps(
        {"kind": "tiny_eagle3", "cfg": cfg, "init": init, "seed": seed, "target": str(target_dir.resolve())},
        sort_keys=True,
    )
    with locked(out):
        if not is_fresh(out, fp):
            with atomic_dir(out, {"fingerprint": fp}) as tmp:
                target_weights = None
                if init == "early_exit":
                    from safetensors.torch import load_file

                    target_weights = {}
                    for f in sorted(target_dir.glob("*.safetensors")):
                        target_weights.update(load_file(str(f)))
                ids = draft_vocab_ids(tcfg["vocab_size"], draft_vocab_size, seed)
                tensors = eagle3_tensors(tcfg, cfg, ids, init, target_weights, seed)
                wdtype = getattr(torch, dtype)
                tensors = {k: (v.to(wdtype) if v.is_floating_point() else v) for k, v in tensors.items()}
                _save(tensors, tmp / "model.safetensors")
                (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
                # sglang may build a tokenizer for the draft runner; make the dir self-contained.
                copy_tokenizer(target_dir, tmp)
    return TinyArtefact(out, _load_config(out))
