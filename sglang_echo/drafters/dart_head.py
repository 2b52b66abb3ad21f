"""The DART draft model in plain torch: one model for the trainer and the offline drafter.

DART (Liu et al., ``shared/seeds/002``, Sec. 3.2) is EAGLE-3's single decoder layer over the
target's fused low/mid/high hidden states, plus ``d - 1`` ``<MASK>`` positions appended after the
prefix. One causal forward over ``[z_1..z_n, MASK_{n+1}..MASK_{n+d-1}]`` gives ``d`` *shifted*
logits: the last prefix position predicts token ``n+1`` and mask ``j`` predicts ``n+1+j``. There is
no autoregressive rollout: the ``d`` per-position marginals come from one forward.

Everything but the masks is :class:`~sglang_echo.drafters.eagle3_head.Eagle3Head` (imported, not
copied): ``fc`` over the concatenated features, the ``[norm(embed), norm(hidden)]`` attention
input, the layer, the reduced-vocabulary LM head with ``d2t``/``t2d``. The prefix is EAGLE's pair
sequence: pair ``t`` = ``(fc(h_t), x_{t+1})`` at rotary position ``t``.

Checkpoint layout. We matched fvliang/DART's ``LlamaForCausalLMDart`` (``dart/model/llama3_dart.py``)
where we could read it: the SpecForge names of EAGLE-3 (``fc.weight``, ``midlayer.self_attn.*``,
``midlayer.mlp.*``, ``midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}``,
``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``) plus ``midlayer.mask_rep``, the mask
representation. As in DART, ``mask_rep`` lives in the layer's *attention-input* space ``[2H]``
(it replaces ``[norm(embed), norm(hidden)]`` at a mask position, bypassing both norms) and its
first ``H`` entries are the mask position's residual. ``config.json`` has
``architectures = ["LlamaForCausalLMDart"]``, ``model_type = "llama"`` and DART's ``draft_length``,
which counts the *mask* positions (DART's layer appends ``draft_length`` masks and returns
``draft_length + 1`` outputs), so our ``depth`` is ``draft_length + 1``.

One deliberate difference: DART's released layer has a single ``mask_rep`` vector ``[2H]`` shared by
every mask position (they differ only by RoPE position); ours defaults to ``d - 1`` learned mask
embeddings, ``mask_rep [d-1, 2H]`` (``dart_mask_embeddings = "per_position"`` in ``config.json``),
which the paper's "a set of trainable parameters" allows. ``DartConfig(shared_mask=True)`` (trainer
flag ``--dart-shared-mask``) gives exactly DART's ``[2H]`` tensor, and a ``[2H]`` checkpoint loads as
shared. The token embedding is the target's, frozen and never saved (DART loads it from the target).
We also write EAGLE-3's ``eagle_config.eagle_aux_hidden_state_layer_ids`` (captured layers), which
DART's loader ignores.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch import Tensor, nn

from .checkpoint import read_config, read_weights
from .eagle3_head import ARCHITECTURE as EAGLE3_ARCHITECTURE
from .eagle3_head import Eagle3Config, Eagle3Head
from .rotary import rope

ARCHITECTURE = "LlamaForCausalLMDart"
MASK_KEY = "midlayer.mask_rep"
TRIE_FILE = "ngram-trie.safetensors"  # the n-gram trie DART's pruning reads, next to the head


@dataclass(frozen=True)
class DartConfig(Eagle3Config):
    depth: int = 8  # d: shifted logits per forward (the last prefix position + d - 1 masks)
    shared_mask: bool = False  # one mask vector for every mask position (DART's released layout)

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError(f"DART depth must be >= 1, got {self.depth}")

    @property
    def num_masks(self) -> int:
        return self.depth - 1

    @classmethod
    def for_target(
        cls,
        target_cfg: dict,
        draft_vocab_size: int,
        aux_layer_ids: tuple[int, ...] | None = None,
        depth: int = 8,
        shared_mask: bool = False,
    ) -> DartConfig:
        base = super().for_target(target_cfg, draft_vocab_size, aux_layer_ids)
        return replace(base, depth=depth, shared_mask=shared_mask)

    def to_hf(self, extra: dict | None = None) -> dict:
        cfg = super().to_hf()
        cfg.pop("depth")
        cfg.pop("shared_mask")
        cfg["architectures"] = [ARCHITECTURE]
        cfg["draft_length"] = self.depth - 1
        cfg["dart_mask_embeddings"] = "shared" if self.shared_mask else "per_position"
        return {**cfg, **(extra or {})}

    @classmethod
    def from_hf(cls, cfg: dict, num_target_layers: int | None = None) -> DartConfig:
        if ARCHITECTURE not in cfg.get("architectures", []):
            raise ValueError(f"not a DART head: architectures={cfg.get('architectures')}")
        if "draft_length" not in cfg:
            raise ValueError("DART config.json has no draft_length (the number of mask positions)")
        base = Eagle3Config.from_hf({**cfg, "architectures": [EAGLE3_ARCHITECTURE]}, num_target_layers)
        return cls(
            **asdict(base),
            depth=int(cfg["draft_length"]) + 1,
            shared_mask=cfg.get("dart_mask_embeddings", "shared") == "shared",
        )


class DartHead(Eagle3Head):
    """:class:`Eagle3Head` plus the mask representation; see the module docstring."""

    cfg: DartConfig

    def __init__(self, cfg: DartConfig, embed: Tensor):
        super().__init__(cfg, embed)
        n = 1 if cfg.shared_mask else cfg.num_masks
        self.mask_rep = nn.Parameter(torch.randn(max(n, 1), 2 * cfg.hidden_size))

    # -- the layer's inputs ---------------------------------------------------------------------
    def pair_inputs(self, hidden: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Prefix pairs: fused features [..., H] + next tokens -> (attention input [..., 2H], residual)."""
        emb = nn.functional.embedding(tokens, self.embed).to(hidden.dtype)
        return torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], -1), hidden

    def mask_inputs(self, j: Tensor) -> tuple[Tensor, Tensor]:
        """Mask positions (0-based index ``j`` = the ``j+1``-th mask) -> (attention input, residual)."""
        rep = self.mask_rep[torch.zeros_like(j) if self.cfg.shared_mask else j]
        return rep, rep[..., : self.cfg.hidden_size]

    def qkv(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Attention input ``[..., T, 2H]`` -> rotated q, k and v, heads-first ``[..., heads, T, D]``."""
        c = self.cfg
        lead, T = x.shape[:-2], x.shape[-2]

        def heads(t: Tensor, n: int) -> Tensor:
            return t.view(*lead, T, n, c.head_dim).transpose(-2, -3)

        pos = positions.unsqueeze(-2)  # broadcast over heads
        q = rope(heads(self.q_proj(x), c.num_attention_heads), pos, c)
        k = rope(heads(self.k_proj(x), c.num_key_value_heads), pos, c)
        return q, k, heads(self.v_proj(x), c.num_key_value_heads)

    @torch.no_grad()
    def prefix_logits(self, fused: Tensor, tokens: Tensor) -> Tensor:
        """The reference forward, no cache: one unpadded prefix of ``n`` pairs (``fused [n, H]``,
        ``tokens [n]`` = each pair's next token) -> the ``d`` shifted logits ``[d, Vd]``."""
        n, m = fused.shape[0], self.cfg.num_masks
        xp, rp = self.pair_inputs(fused[None], tokens[None])
        xm, rm = self.mask_inputs(torch.arange(m, device=fused.device))
        x, res = torch.cat([xp, xm[None].to(xp.dtype)], 1), torch.cat([rp, rm[None].to(rp.dtype)], 1)
        q, k, v = self.qkv(x, torch.arange(n + m, device=fused.device)[None])
        causal = torch.ones(n + m, n + m, dtype=torch.bool, device=fused.device).tril()
        logits, _ = self.finish(self.attend(q, k, v, causal[None, None]), res)
        return logits[0, n - 1 :]

    # -- checkpoints (DART / SpecForge layout) ---------------------------------------------------
    def export_state(self, dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
        out = super().export_state(dtype)
        rep = out.pop("mask_rep")
        out[MASK_KEY] = rep[0].contiguous() if self.cfg.shared_mask else rep
        return out

    def import_state(self, tensors: dict[str, Tensor]) -> None:
        tensors = dict(tensors)
        if MASK_KEY not in tensors:
            raise ValueError(f"DART checkpoint mismatch: missing {MASK_KEY}")
        rep = tensors.pop(MASK_KEY)
        rep = rep.reshape(1, -1) if rep.dim() == 1 else rep
        if tuple(rep.shape) != tuple(self.mask_rep.shape):
            raise ValueError(
                f"DART checkpoint mismatch: {MASK_KEY} {tuple(rep.shape)}, expected "
                f"{tuple(self.mask_rep.shape)} (config depth {self.cfg.depth}, shared={self.cfg.shared_mask})"
            )
        super().import_state({**tensors, "mask_rep": rep})

    @classmethod
    def load(cls, path: Path, embed: Tensor, num_target_layers: int | None = None) -> DartHead:
        raw = read_config(path, "DART")
        cfg = DartConfig.from_hf(raw, num_target_layers)
        tensors = read_weights(path)
        if raw.get("dart_mask_embeddings") is None and MASK_KEY in tensors:  # a released head: as stored
            cfg = replace(cfg, shared_mask=tensors[MASK_KEY].dim() == 1)
        head = cls(cfg, embed)
        head.import_state(tensors)
        return head.to(embed.dtype)
