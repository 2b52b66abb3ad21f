"""The DFlash block-diffusion draft model in plain torch: one model for the trainer and the drafter.

DFlash (Chen et al. 2026, arXiv:2602.06036; public code ``z-lab/dflash``, served by sglang's
``DFlashDraftModel`` in ``srt/models/dflash.py``) drafts a whole block in one forward. For a request
whose committed tokens are ``x_0 .. x_P`` (``x_P`` the last one, the next tree's root):

* **Context.** The target's hidden states of the committed positions ``t < P`` (the outputs of a
  few evenly spaced target layers, concatenated) are fused by ``fc`` and ``hidden_norm`` into one
  ``H``-vector per position, ``c_t = hidden_norm(fc(f_t))``. In *every* draft layer, ``c_t`` is
  projected by that layer's ``k_proj``/``v_proj`` (no ``input_layernorm``; ``k_norm`` and RoPE at
  position ``t`` on the key) into extra keys/values: the context is injected as K/V only, it never
  runs through the layers. These K/V depend on nothing drafted, so a drafter caches them and appends
  the committed positions after every verification (:meth:`DFlashHead.context_kv`).
* **Block.** The block ``[x_P, MASK x (block_size - 1)]`` at rotary positions ``P .. P + bs - 1``
  (token embeddings from the *target's* embedding table, the mask as the target's embedding of
  ``mask_token_id``) runs through ``num_hidden_layers`` Qwen3-style decoder layers (pre-norm, per-head
  ``q_norm``/``k_norm``, SwiGLU MLP). Attention is non-causal: every block position sees the whole
  context and the whole block. The output ``norm(h)`` goes through the *target's* LM head: block
  position ``i >= 1`` predicts ``x_{P + i}`` (position 0 is the anchor and predicts nothing).

Checkpoint layout (``config.json`` + ``model.safetensors``), matched to z-lab/dflash
``dflash/model.py`` and to what sglang 0.5.23's ``DFlashDraftModel.load_weights`` and
``parse_dflash_draft_config`` read::

    fc.weight [H, n_ctx * H]       hidden_norm.weight [H]      norm.weight [H]
    layers.{i}.input_layernorm.weight / post_attention_layernorm.weight [H]
    layers.{i}.self_attn.{q,k,v,o}_proj.weight      layers.{i}.self_attn.{q,k}_norm.weight [head_dim]
    layers.{i}.mlp.{gate,up,down}_proj.weight

``config.json``: ``architectures = ["DFlashDraftModel"]``, ``model_type = "qwen3"``, the Qwen3 geometry
keys (``hidden_size``, ``num_hidden_layers`` = draft layers, ``head_dim``, ``rope_theta`` and
``rope_parameters`` ...), ``num_target_layers``, ``block_size`` (top level, as in z-lab's first
releases) and ``dflash_config = {block_size, target_layer_ids, mask_token_id, mask_token}`` (where
z-lab's current code and sglang look first), ``layer_types = ["full_attention"] * n`` and
``is_causal = false`` (bidirectional block). ``target_layer_ids`` use z-lab's convention: layer ``i``'s
*output*, HF ``hidden_states[i + 1]`` (z-lab's ``extract_context_feature`` offset; sglang captures
"before layer i + 1"). This repo's feature capture names *input* layers, so
:attr:`DFlashConfig.captured_layers` is ``target_layer_ids + 1``. The token embedding and the LM head
are the target's, frozen and never stored (as in z-lab and sglang, which both borrow them); the
mask token's embedding is the target's row ``mask_token_id`` (no trained mask vector, so no
``mask_embedding.pt`` is needed by sglang). Not supported: DFlash2's candidate selector and grouped
convolutions, sliding-window layers, Domino projectors.

RMSNorm is :mod:`.eagle3_head`'s; RoPE is :mod:`.rotary`'s (transformers' frequencies, scaling included).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checkpoint import read_config, read_weights, write_checkpoint
from .eagle3_head import RMSNorm
from .rotary import read_rope, rope

ARCHITECTURE = "DFlashDraftModel"
DEFAULT_MASK_TOKEN = "<|MASK|>"  # z-lab / sglang's default mask token string


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """DFlash's default choice when a config names none: ``num_draft_layers`` target layers evenly
    spaced over ``1 .. L - 3`` (the middle layer for a single one), as z-lab and sglang pick them."""
    L, n = int(num_target_layers), int(num_draft_layers)
    if n == 1:
        return (L // 2,)
    if L < 4:
        raise ValueError(f"DFlash's layer choice needs >= 4 target layers, got {L}")
    lo, hi = 1, L - 3
    return tuple(int(round(lo + i * (hi - lo) / (n - 1))) for i in range(n))


@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_hidden_layers: int  # draft decoder layers
    target_layer_ids: tuple[int, ...]  # z-lab convention: outputs of these target layers
    num_target_layers: int
    block_size: int = 16
    mask_token_id: int = 0
    mask_token: Optional[str] = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192
    # transformers' rope parameters when the RoPE is scaled (llama3, yarn ...), None for plain RoPE.
    rope_scaling: Optional[dict] = field(default=None, hash=False)

    def __post_init__(self) -> None:
        if self.block_size < 2:
            raise ValueError(f"DFlash block_size must be >= 2 (anchor + at least one mask), got {self.block_size}")
        if not self.target_layer_ids:
            raise ValueError("DFlash needs at least one target layer")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} outside the vocabulary ({self.vocab_size})")

    @property
    def captured_layers(self) -> tuple[int, ...]:
        """The target layers whose *input* residual stream this repo captures (HF ``hidden_states[i]``)."""
        return tuple(i + 1 for i in self.target_layer_ids)

    @property
    def num_context_features(self) -> int:
        return len(self.target_layer_ids)

    @classmethod
    def for_target(
        cls,
        target_cfg: dict,
        *,
        num_hidden_layers: int = 2,
        block_size: int = 16,
        target_layer_ids: Optional[tuple[int, ...]] = None,
        mask_token_id: int = 0,
        mask_token: Optional[str] = None,
    ) -> DFlashConfig:
        """A head whose layer geometry mirrors the target's (DFlash's released drafts do the same)."""
        L, nh = target_cfg["num_hidden_layers"], target_cfg["num_attention_heads"]
        head_dim = target_cfg.get("head_dim") or target_cfg["hidden_size"] // nh
        max_pos = target_cfg.get("max_position_embeddings", 8192)
        rope_theta, rope_scaling = read_rope(target_cfg, head_dim, max_pos)
        return cls(
            hidden_size=target_cfg["hidden_size"],
            num_attention_heads=nh,
            num_key_value_heads=target_cfg.get("num_key_value_heads", nh),
            head_dim=head_dim,
            intermediate_size=target_cfg["intermediate_size"],
            vocab_size=target_cfg["vocab_size"],
            num_hidden_layers=num_hidden_layers,
            target_layer_ids=tuple(target_layer_ids or default_target_layer_ids(L, num_hidden_layers)),
            num_target_layers=L,
            block_size=block_size,
            mask_token_id=mask_token_id,
            mask_token=mask_token,
            rms_norm_eps=target_cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            max_position_embeddings=max_pos,
            rope_scaling=rope_scaling,
        )

    def to_hf(self, extra: Optional[dict] = None) -> dict:
        dflash = {
            "block_size": self.block_size,
            "target_layer_ids": list(self.target_layer_ids),
            "mask_token_id": self.mask_token_id,
        }
        if self.mask_token is not None:
            dflash["mask_token"] = self.mask_token
        return {
            "architectures": [ARCHITECTURE],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "num_hidden_layers": self.num_hidden_layers,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_theta": self.rope_theta, **(self.rope_scaling or {"rope_type": "default"})},
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "tie_word_embeddings": False,
            "layer_types": ["full_attention"] * self.num_hidden_layers,
            "is_causal": False,
            "num_target_layers": self.num_target_layers,
            "block_size": self.block_size,
            "dflash_config": dflash,
            **(extra or {}),
        }

    @classmethod
    def from_hf(cls, cfg: dict, num_target_layers: Optional[int] = None) -> DFlashConfig:
        if ARCHITECTURE not in cfg.get("architectures", []):
            raise ValueError(f"not a DFlash draft: architectures={cfg.get('architectures')}")
        dcfg = cfg.get("dflash_config") or {}

        def get(key, default=None):
            return dcfg.get(key, cfg.get(key, default))

        for key, want in (
            ("layer_types", None),
            ("projector_type", None),
            ("selector_rank", 0),
            ("conv_kernel_size", 0),
        ):
            v = get(key, want)
            if key == "layer_types" and v is not None and any(t != "full_attention" for t in v):
                raise ValueError(f"DFlash sliding-window layers are not supported: layer_types={v}")
            if key != "layer_types" and v not in (want, None, 0):
                raise ValueError(f"unsupported DFlash variant: {key}={v!r}")
        n_layers = int(cfg["num_hidden_layers"])
        L = get("num_target_layers", num_target_layers)
        ids = get("target_layer_ids")
        if ids is None:
            if L is None:
                raise ValueError("the draft names no target_layer_ids; pass the target's layer count")
            ids = default_target_layer_ids(int(L), n_layers)
        if L is None:
            L = max(ids) + 1
        mask_id = get("mask_token_id")
        if mask_id is None:
            raise ValueError("DFlash config.json has no mask_token_id")
        nh = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // nh
        max_pos = cfg.get("max_position_embeddings", 8192)
        rope_theta, rope_scaling = read_rope(cfg, head_dim, max_pos)
        return cls(
            hidden_size=cfg["hidden_size"],
            num_attention_heads=nh,
            num_key_value_heads=cfg.get("num_key_value_heads", nh),
            head_dim=head_dim,
            intermediate_size=cfg["intermediate_size"],
            vocab_size=cfg["vocab_size"],
            num_hidden_layers=n_layers,
            target_layer_ids=tuple(int(i) for i in ids),
            num_target_layers=int(L),
            block_size=int(get("block_size", 16)),
            mask_token_id=int(mask_id),
            mask_token=get("mask_token"),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            max_position_embeddings=max_pos,
            rope_scaling=rope_scaling,
        )


def grouped_block_attention(
    q: Tensor, kc: Tensor, vc: Tensor, k: Tensor, v: Tensor, ctx_mask: Tensor, group: int
) -> Tensor:
    """Attention of ``S`` block positions, ``S / group`` blocks side by side: query ``i`` sees the
    context keys ``ctx_mask`` allows and all ``group`` keys of its own block ``i // group``, nothing
    else. This is what a dense ``[S, Tc + S]`` mask with a block-diagonal right half computes, in
    ``O(S * (Tc + group))`` time and memory instead of ``O(S * (Tc + S))``. One softmax runs over both
    parts' scores together, so it is exact. ``q [B, Hq, S, D]``; ``kc, vc [B, Hk, Tc, D]``;
    ``k, v [B, Hk, S, D]``; ``ctx_mask [B or 1, 1, S, Tc]`` bool. Returns ``[B, Hq, S, D]``."""
    S, D, Tc = q.shape[2], q.shape[3], kc.shape[2]
    rep = q.shape[1] // kc.shape[1]
    kc, vc, k, v = (x.repeat_interleave(rep, 1) for x in (kc, vc, k, v))  # GQA
    scale = D**-0.5
    ctx_scores = (q @ kc.transpose(-1, -2) * scale).masked_fill(~ctx_mask, float("-inf"))
    qb, kb, vb = (x.unflatten(2, (S // group, group)) for x in (q, k, v))
    blk_scores = (qb @ kb.transpose(-1, -2) * scale).flatten(2, 3)  # [B, H, S, group]
    p = torch.cat([ctx_scores, blk_scores], -1).softmax(-1)  # rows never empty: a block sees itself
    p_ctx, p_blk = p[..., :Tc].to(vc.dtype), p[..., Tc:].to(vb.dtype)
    return p_ctx @ vc + (p_blk.unflatten(2, (S // group, group)) @ vb).flatten(2, 3)


class DFlashAttention(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        H, nh, nkv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(H, nh * hd, bias=False)
        self.k_proj = nn.Linear(H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)


class DFlashMLP(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DFlashAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DFlashMLP(cfg)


class DFlashHead(nn.Module):
    """The draft model; ``embed`` and ``lm_head`` are the target's (frozen buffers, never saved)."""

    def __init__(self, cfg: DFlashConfig, embed: Tensor, lm_head: Optional[Tensor] = None):
        super().__init__()
        self.cfg = cfg
        H = cfg.hidden_size
        if tuple(embed.shape) != (cfg.vocab_size, H):
            raise ValueError(f"target embedding {tuple(embed.shape)} does not fit the draft ({cfg.vocab_size}, {H})")
        self.fc = nn.Linear(cfg.num_context_features * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.register_buffer("embed", embed.detach(), persistent=False)
        self.register_buffer("lm_head", (embed if lm_head is None else lm_head).detach(), persistent=False)

    # -- pieces ---------------------------------------------------------------------------------
    def _heads(self, x: Tensor, n: int) -> Tensor:
        """[..., T, n * D] -> heads-first [..., n, T, D]."""
        return x.view(*x.shape[:-1], n, self.cfg.head_dim).transpose(-2, -3)

    def context(self, features: Tensor) -> Tensor:
        """Concatenated target features ``[..., n_ctx * H]`` -> fused context ``[..., H]``."""
        return self.hidden_norm(self.fc(features))

    def context_kv(self, ctx: Tensor, positions: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Fused context ``[B, T, H]`` at ``positions [B, T]`` -> per layer (k, v) ``[B, kv_heads, T, D]``."""
        c, out = self.cfg, []
        pos = positions[:, None, :]
        for layer in self.layers:
            a = layer.self_attn
            k = self._heads(
                a.k_norm(a.k_proj(ctx).view(*ctx.shape[:-1], c.num_key_value_heads, c.head_dim)).flatten(-2),
                c.num_key_value_heads,
            )
            out.append((rope(k, pos, c), self._heads(a.v_proj(ctx), c.num_key_value_heads)))
        return out

    def block_tokens(self, anchors: Tensor) -> Tensor:
        """Anchor tokens ``[...]`` -> blocks ``[..., block_size]``: the anchor then mask tokens."""
        blk = torch.full(
            (*anchors.shape, self.cfg.block_size), self.cfg.mask_token_id, dtype=torch.int64, device=anchors.device
        )
        blk[..., 0] = anchors
        return blk

    def forward_blocks(
        self,
        tokens: Tensor,
        positions: Tensor,
        ctx_kv: list[tuple[Tensor, Tensor]],
        mask: Tensor,
        group: Optional[int] = None,
    ) -> Tensor:
        """The draft layers over block tokens ``[B, S]`` at ``positions [B, S]``: keys are the context
        ``ctx_kv`` (per layer, ``[B, kv_heads, Tc, D]``) followed by the ``S`` block positions
        themselves; ``mask [B or 1, 1, S, Tc + S]`` (True = may attend) says which each sees.
        With ``group``, the ``S`` positions are ``S / group`` blocks side by side that each see only
        themselves: ``mask`` is then ``[B or 1, 1, S, Tc]`` (the context part) and attention runs in
        :func:`grouped_block_attention`, linear in the number of blocks (training packs hundreds).
        Returns ``norm(h)`` ``[B, S, H]`` (logits: :meth:`logits`)."""
        c = self.cfg
        h = F.embedding(tokens, self.embed).to(self.fc.weight.dtype)
        pos = positions[:, None, :]
        for layer, (kc, vc) in zip(self.layers, ctx_kv):
            a = layer.self_attn
            x = layer.input_layernorm(h)
            q = a.q_norm(a.q_proj(x).view(*x.shape[:-1], c.num_attention_heads, c.head_dim)).flatten(-2)
            k = a.k_norm(a.k_proj(x).view(*x.shape[:-1], c.num_key_value_heads, c.head_dim)).flatten(-2)
            q = rope(self._heads(q, c.num_attention_heads), pos, c)
            k = rope(self._heads(k, c.num_key_value_heads), pos, c)
            v = self._heads(a.v_proj(x), c.num_key_value_heads)
            if group is None:
                attn = F.scaled_dot_product_attention(
                    q, torch.cat([kc, k], 2), torch.cat([vc, v], 2), attn_mask=mask, enable_gqa=True
                )
            else:
                attn = grouped_block_attention(q, kc, vc, k, v, mask, group)
            h = h + a.o_proj(attn.transpose(1, 2).flatten(-2))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.norm(h)

    def logits(self, hidden: Tensor) -> Tensor:
        """``norm(h)`` -> logits over the target vocabulary (the target's LM head). Flattened to one
        2-D GEMM: a strided 3-D ``hidden`` (``hid[:, 1:]``) otherwise goes to a batched GEMM that is
        ~3x slower on the CPU for the 49k-row head."""
        flat = F.linear(hidden.reshape(-1, hidden.shape[-1]), self.lm_head.to(hidden.dtype))
        return flat.view(*hidden.shape[:-1], flat.shape[-1])

    @torch.no_grad()
    def reference_block_logits(self, features: Tensor, anchor: int) -> Tensor:
        """No cache, one request: context features ``[P, n_ctx * H]`` of positions ``0 .. P-1`` and the
        anchor token at position ``P`` -> block logits ``[block_size - 1, V]`` (predicting ``P+1 ..``)."""
        P, bs, dev = features.shape[0], self.cfg.block_size, features.device
        ctx = self.context(features[None].to(self.fc.weight.dtype))
        kv = self.context_kv(ctx, torch.arange(P, device=dev)[None])
        blk = self.block_tokens(torch.tensor([anchor], device=dev))
        hid = self.forward_blocks(blk, torch.arange(P, P + bs, device=dev)[None], kv, None)
        return self.logits(hid[0, 1:])

    # -- checkpoints (z-lab / sglang layout) -------------------------------------------------------
    def export_state(self, dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
        return {k: t.to(dtype).detach().cpu().contiguous() for k, t in self.state_dict().items()}

    def import_state(self, tensors: dict[str, Tensor]) -> None:
        state = {
            k.removeprefix("model."): t
            for k, t in tensors.items()
            if not k.removeprefix("model.").startswith(("embed_tokens", "lm_head"))
        }  # the target's
        missing, unexpected = self.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"DFlash checkpoint mismatch: missing {missing}, unexpected {unexpected}")

    def save(self, out: Path, extra_config: Optional[dict] = None, dtype: torch.dtype = torch.bfloat16) -> None:
        write_checkpoint(out, self, dtype, extra_config)

    @classmethod
    def load(
        cls, path: Path, embed: Tensor, lm_head: Optional[Tensor] = None, num_target_layers: Optional[int] = None
    ) -> DFlashHead:
        cfg = DFlashConfig.from_hf(read_config(path, "DFlash"), num_target_layers)
        if num_target_layers is not None and max(cfg.target_layer_ids) >= num_target_layers:
            raise ValueError(f"target_layer_ids {cfg.target_layer_ids} outside a {num_target_layers}-layer target")
        head = cls(cfg, embed, lm_head)
        head.import_state(read_weights(path))
        return head.to(embed.dtype)
