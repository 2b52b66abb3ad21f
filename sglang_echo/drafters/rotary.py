"""Rotary position embedding for the draft heads, with the frequencies transformers derives from
the head's ``config.json``.

sglang builds a head's rotary embedding from the config transformers parses (``rope_theta`` at the
top level or inside ``rope_parameters``; ``rope_scaling`` / ``rope_parameters`` with a ``rope_type``
such as Llama-3.1's ``llama3``), so the offline heads must read it the same way or their drafts,
and every acceptance number measured with them, drift from what the server drafts. Nothing here
re-derives a frequency formula: :func:`read_rope` lets transformers' own ``LlamaConfig`` normalise
the keys, and :class:`Rotary` takes the inverse frequencies and the cos/sin scale from
``LlamaRotaryEmbedding`` (``ROPE_INIT_FUNCTIONS`` for ``dynamic``'s length-dependent ones). Both
exist with these signatures in transformers 5.17 and 5.19.

The rotation itself is neox-style (sglang's Llama and HF's ``rotate_half``), computed in fp32 and
cast back to the input's dtype. For plain RoPE (``rope_type`` default) it is bit-for-bit the
formula the heads used before scaling was read: transformers' default inverse frequencies are
``1 / theta ** (arange(0, D, 2) / D)`` in fp32 and the cos/sin scale is exactly 1.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from typing import Optional, Protocol

import torch
from torch import Tensor

# rope_type values the heads run (transformers' names). "dynamic" recomputes its frequencies from
# the largest position of each call, as transformers does for a sequence that only grows; the
# others are fixed per config. Refused with a one-line error: longrope (transformers switches its
# factors on state kept between calls) and RoPE nested per layer type (a draft layer has one).
SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")
ROPE_KEYS = (
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "partial_rotary_factor",
    "original_max_position_embeddings",
)


class RopeGeometry(Protocol):
    """What a head config exposes for RoPE (:class:`.eagle3_head.Eagle3Config`, ``DFlashConfig``)."""

    rope_theta: float
    rope_scaling: Optional[dict]
    head_dim: int
    max_position_embeddings: int


def _llama_config(rope: dict, head_dim: int, max_position_embeddings: int):
    """A transformers ``LlamaConfig`` holding only ``rope`` (config keys) and the rotary width: one
    head of ``head_dim`` so no other geometry can fail transformers' architecture checks."""
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=head_dim,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        **copy.deepcopy(rope),
    )


def read_rope(cfg: dict, head_dim: int, max_position_embeddings: int) -> tuple[float, Optional[dict]]:
    """``(rope_theta, rope_scaling)`` of an HF ``config.json`` dict as transformers reads it:
    ``rope_scaling`` is None for plain RoPE, else transformers' normalised parameters (``rope_type``,
    ``factor``, ...; without ``rope_theta``). A config without any theta gets transformers' default
    (10000). ValueError (one line, naming the setting) for what transformers or the heads reject."""
    given = {k: cfg[k] for k in ROPE_KEYS if cfg.get(k) is not None}
    try:
        params = dict(_llama_config(given, head_dim, max_position_embeddings).rope_parameters)
    except Exception as e:  # transformers raises KeyError/ValueError/TypeError for malformed blocks
        raise ValueError(f"rope settings {given}: transformers rejects them ({_one_line(e)})") from None
    nested = [k for k, v in params.items() if isinstance(v, dict)]
    if nested:
        raise ValueError(f"rope_parameters per layer type ({', '.join(nested)}): the draft heads run one RoPE")
    rope_type = params.get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"rope_type {rope_type!r}: the draft heads run {', '.join(SUPPORTED_ROPE_TYPES)}")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"partial_rotary_factor {params['partial_rotary_factor']}: the draft heads rotate whole heads")
    raw = params.pop("rope_theta")
    try:
        theta = float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"rope_theta {raw!r}: not a number") from None
    params.pop("type", None)  # the legacy spelling of rope_type, which transformers keeps beside it
    if rope_type == "default":
        return theta, None
    try:
        Rotary(theta, params, head_dim, max_position_embeddings)  # transformers' checks now, not mid-draft
    except Exception as e:
        raise ValueError(f"rope settings {given}: transformers rejects them ({_one_line(e)})") from None
    return theta, params


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: " + " ".join(str(e).split())


def rope_config(theta: float, scaling: Optional[dict]) -> dict:
    """The config keys that give back ``(theta, scaling)`` through :func:`read_rope`: ``rope_theta``,
    plus ``rope_scaling`` (the key SpecForge writes and both transformers 4 and 5 read) if scaled."""
    return {"rope_theta": theta, **({"rope_scaling": dict(scaling)} if scaling else {})}


class Rotary:
    """The rotary embedding of one head geometry; call it as ``rotary(x, positions)``."""

    def __init__(self, theta: float, scaling: Optional[dict], head_dim: int, max_position_embeddings: int):
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.config = _llama_config(rope_config(theta, scaling), head_dim, max_position_embeddings)
        emb = LlamaRotaryEmbedding(self.config)
        self.rope_type = emb.rope_type
        self.max_position_embeddings = max_position_embeddings
        self.inv_freq = emb.inv_freq.detach().float().cpu()  # [D/2]
        self.scale = float(emb.attention_scaling)  # yarn's cos/sin factor; 1.0 for the rest
        self._on: dict[torch.device, Tensor] = {}

    def frequencies(self, positions: Tensor) -> Tensor:
        """Inverse frequencies ``[D/2]`` on ``positions``' device for a call at these positions."""
        if self.rope_type == "dynamic" and positions.numel():
            seq_len = int(positions.max()) + 1  # transformers' dynamic NTK: the call's extent
            if seq_len > self.max_position_embeddings:
                from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

                inv, _ = ROPE_INIT_FUNCTIONS["dynamic"](self.config, None, seq_len=seq_len)
                return inv.float().to(positions.device)
        dev = positions.device
        if dev not in self._on:
            self._on[dev] = self.inv_freq.to(dev)
        return self._on[dev]

    def __call__(self, x: Tensor, positions: Tensor) -> Tensor:
        """``x [..., T, D]`` rotated at ``positions`` (broadcast against ``x[..., 0]``)."""
        D = x.shape[-1]
        ang = positions.float()[..., None] * self.frequencies(positions)  # [..., T, D/2]
        cos, sin = ang.cos(), ang.sin()
        if self.scale != 1.0:
            cos, sin = cos * self.scale, sin * self.scale
        x1, x2 = x[..., : D // 2].float(), x[..., D // 2 :].float()
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)


@lru_cache(maxsize=32)
def _rotary(theta: float, scaling_json: str, head_dim: int, max_position_embeddings: int) -> Rotary:
    return Rotary(theta, json.loads(scaling_json), head_dim, max_position_embeddings)


def rope(x: Tensor, positions: Tensor, cfg: RopeGeometry) -> Tensor:
    """``x [..., T, D]`` rotated at ``positions`` with ``cfg``'s RoPE (one :class:`Rotary` per geometry)."""
    key = json.dumps(cfg.rope_scaling, sort_keys=True)
    return _rotary(float(cfg.rope_theta), key, cfg.head_dim, cfg.max_position_embeddings)(x, positions)
