"""The EAGLE-3 draft head in plain torch: one model for the trainer and the offline drafter.

The head reads the SpecForge / EAGLE-3 checkpoint layout that sglang's
``LlamaForCausalLMEagle3`` loads (``config.json`` + ``model.safetensors``)::

    fc.weight [H, 3H]                       fuses the low/mid/high target hidden states
    midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight [H]
    midlayer.self_attn.{q,k,v}_proj.weight  [*, 2H]   input = [norm(embed), norm(hidden)]
    midlayer.self_attn.o_proj.weight, midlayer.mlp.{gate,up,down}_proj.weight
    norm.weight [H] | lm_head.weight [Vd, H] (reduced draft vocabulary)
    d2t int64 [Vd]  target_id = draft_id + d2t[draft_id] | t2d bool [V]

and computes what sglang computes with it (``llama_eagle3.py``): the layer's output is
``mlp(norm(attn + h)) + attn + h``; the logits read ``norm`` of it and the *un-normalised* sum is
the hidden state the next draft step consumes. The token embedding is the target's, frozen and
never saved (sglang's EAGLE worker shares it with the draft: ``set_embed``).

The decoder layer is split into :meth:`Eagle3Head.project` (norms, q/k/v, RoPE) and
:meth:`Eagle3Head.finish` (o_proj, MLP, logits) so callers own the attention pattern: the
trainer's training-time-test mask and the drafter's tree-shaped KV both sit between the two.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checkpoint import read_config, read_weights, write_checkpoint
from .rotary import read_rope, rope

ARCHITECTURE = "LlamaForCausalLMEagle3"
# Module names here -> names in the SpecForge / sglang checkpoint (everything else is the same).
SPECFORGE_NAMES = {
    "input_layernorm": "midlayer.input_layernorm",
    "hidden_norm": "midlayer.hidden_norm",
    "post_attention_layernorm": "midlayer.post_attention_layernorm",
    **{p: f"midlayer.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")},
    **{p: f"midlayer.mlp.{p}" for p in ("gate_proj", "up_proj", "down_proj")},
}


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    aux_layer_ids: tuple[int, ...]  # target layers whose *input* residual stream is captured
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192
    # transformers' rope parameters when the RoPE is scaled (Llama-3.1's llama3 ...), None for plain RoPE.
    rope_scaling: Optional[dict] = field(default=None, hash=False)

    @classmethod
    def for_target(
        cls, target_cfg: dict, draft_vocab_size: int, aux_layer_ids: tuple[int, ...] | None = None
    ) -> Eagle3Config:
        """The head's geometry mirrors the target's (sglang's default for EAGLE-3 heads)."""
        L, nh = target_cfg["num_hidden_layers"], target_cfg["num_attention_heads"]
        head_dim = target_cfg.get("head_dim") or target_cfg["hidden_size"] // nh
        max_pos = target_cfg.get("max_position_embeddings", 8192)
        theta, scaling = read_rope(target_cfg, head_dim, max_pos)
        return cls(
            hidden_size=target_cfg["hidden_size"],
            num_attention_heads=nh,
            num_key_value_heads=target_cfg.get("num_key_value_heads", nh),
            head_dim=head_dim,
            intermediate_size=target_cfg["intermediate_size"],
            vocab_size=target_cfg["vocab_size"],
            draft_vocab_size=draft_vocab_size,
            # sglang's default capture (EAGLEWorker): inputs of layers 2, L/2 and L-3.
            aux_layer_ids=tuple(aux_layer_ids or (2, L // 2, L - 3)),
            rms_norm_eps=target_cfg.get("rms_norm_eps", 1e-5),
            rope_theta=theta,
            max_position_embeddings=max_pos,
            rope_scaling=scaling,
        )

    def to_hf(self, extra: dict | None = None) -> dict:
        """``config.json`` as sglang's ``LlamaForCausalLMEagle3`` reads it."""
        d = asdict(self)
        if d["rope_scaling"] is None:  # written only when scaled: plain heads keep SpecForge's exact keys
            del d["rope_scaling"]
        # sglang's ids name the layer whose *output* is captured (it captures the input of id + 1,
        # ``set_eagle3_layers_to_capture``); ours name the layer whose input is captured.
        layers = [i - 1 for i in d.pop("aux_layer_ids")]
        return {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            **d,
            "num_hidden_layers": 1,
            "hidden_act": "silu",
            # False, or sglang would use embed_tokens as the LM head (no draft vocabulary).
            "tie_word_embeddings": False,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": layers, "use_aux_hidden_state": True},
            **(extra or {}),
        }

    @classmethod
    def from_hf(cls, cfg: dict, num_target_layers: int | None = None) -> Eagle3Config:
        if ARCHITECTURE not in cfg.get("architectures", []):
            raise ValueError(f"not an EAGLE-3 head: architectures={cfg.get('architectures')}")
        layers = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if layers is not None:  # sglang's output-layer ids -> the input-layer ids (see to_hf)
            layers = tuple(i + 1 for i in layers)
        else:
            if num_target_layers is None:
                raise ValueError("the head names no aux layers; pass the target's layer count")
            L = num_target_layers
            layers = (2, L // 2, L - 3)
        nh = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // nh
        max_pos = cfg.get("max_position_embeddings", 8192)
        theta, scaling = read_rope(cfg, head_dim, max_pos)
        return cls(
            hidden_size=cfg["hidden_size"],
            num_attention_heads=nh,
            num_key_value_heads=cfg.get("num_key_value_heads", nh),
            head_dim=head_dim,
            intermediate_size=cfg["intermediate_size"],
            vocab_size=cfg["vocab_size"],
            draft_vocab_size=cfg.get("draft_vocab_size", cfg["vocab_size"]),
            aux_layer_ids=tuple(layers),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=theta,
            max_position_embeddings=max_pos,
            rope_scaling=scaling,
        )


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


@dataclass
class Projected:
    """One draft position after :meth:`Eagle3Head.project`: heads-first ``[B, heads, T, D]``."""

    q: Tensor
    k: Tensor
    v: Tensor
    residual: Tensor  # [B, T, H] the hidden state that enters the layer


class Eagle3Head(nn.Module):
    def __init__(self, cfg: Eagle3Config, embed: Tensor):
        super().__init__()
        self.cfg = cfg
        H, nh, nkv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        n_aux = len(cfg.aux_layer_ids)
        self.fc = nn.Linear(n_aux * H, H, bias=False)
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.q_proj = nn.Linear(2 * H, nh * hd, bias=False)
        self.k_proj = nn.Linear(2 * H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(2 * H, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.gate_proj = nn.Linear(H, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(H, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, H, bias=False)
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False)
        self.register_buffer("embed", embed.detach(), persistent=False)  # the target's, frozen
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))

    # -- the decoder layer, in two halves around attention ---------------------------------
    def fuse(self, aux: Tensor) -> Tensor:
        """Target features ``[..., n_aux * H]`` -> the draft's input hidden state ``[..., H]``."""
        return self.fc(aux)

    def project(self, hidden: Tensor, tokens: Tensor, positions: Tensor) -> Projected:
        """hidden [B, T, H] (fused target features or the previous step's output), tokens and
        positions [B, T] -> rotated q/k/v. The token at position t is the one *after* the
        hidden state's own token (EAGLE pairs h_t with x_{t+1})."""
        c = self.cfg
        B, T, _ = hidden.shape
        x = torch.cat(
            [self.input_layernorm(F.embedding(tokens, self.embed).to(hidden.dtype)), self.hidden_norm(hidden)], -1
        )
        q = self.q_proj(x).view(B, T, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        pos = positions[:, None, :]
        return Projected(rope(q, pos, c), rope(k, pos, c), v, hidden)

    def finish(self, attn: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        """attn [B, heads, T, D] -> (draft-vocab logits [B, T, Vd], next hidden [B, T, H])."""
        out = self.layer_output(attn, residual)
        return self.logits(out), out

    def layer_output(self, attn: Tensor, residual: Tensor) -> Tensor:
        """The layer's un-normalised output: the hidden state the next draft step reads."""
        B, _, T, _ = attn.shape
        h = self.o_proj(attn.transpose(1, 2).reshape(B, T, -1)) + residual
        x = self.post_attention_layernorm(h)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)) + h

    def logits(self, out: Tensor) -> Tensor:
        return self.lm_head(self.norm(out))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """Grouped-query attention; mask [B or 1, 1, Tq, Tk] bool (True = may attend)."""
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    def to_target(self, draft_ids: Tensor) -> Tensor:
        return draft_ids + self.d2t[draft_ids]

    # -- checkpoints (SpecForge layout) ------------------------------------------------------
    def export_state(self, dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
        out = {}
        for name, t in self.state_dict().items():
            mod, _, leaf = name.rpartition(".")
            key = f"{SPECFORGE_NAMES.get(mod, mod)}.{leaf}" if mod else name
            out[key] = (t.to(dtype) if t.is_floating_point() else t).detach().cpu().contiguous()
        return out

    def import_state(self, tensors: dict[str, Tensor]) -> None:
        inverse = {v: k for k, v in SPECFORGE_NAMES.items()}
        state = {}
        for key, t in tensors.items():
            if key.startswith(("embed_tokens", "model.embed_tokens")):
                continue  # a head that ships its own embedding: sglang ignores it in favour of the target's
            mod, _, leaf = key.rpartition(".")
            state[f"{inverse.get(mod, mod)}.{leaf}" if mod else key] = t
        missing, unexpected = self.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"EAGLE-3 checkpoint mismatch: missing {missing}, unexpected {unexpected}")

    def save(self, out: Path, extra_config: dict | None = None, dtype: torch.dtype = torch.bfloat16) -> None:
        write_checkpoint(out, self, dtype, extra_config)

    @classmethod
    def load(cls, path: Path, embed: Tensor, num_target_layers: int | None = None) -> Eagle3Head:
        head = cls(Eagle3Config.from_hf(read_config(path, "EAGLE-3"), num_target_layers), embed)
        head.import_state(read_weights(path))
        return head.to(embed.dtype)
