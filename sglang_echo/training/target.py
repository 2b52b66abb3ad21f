"""The target weights a draft head is built from: its config, embedding, LM head and final norm."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from sglang_echo.drafters.checkpoint import read_weights


@dataclass(frozen=True)
class TargetWeights:
    config: dict  # the target's config.json
    embed: Tensor  # [V, H] float32
    lm_head: Tensor  # [V, H] float32 (the embedding where they are tied)
    norm: Tensor  # [H] float32, the final RMSNorm


def target_weights(target: Path) -> TargetWeights:
    """Read from the target folder in any published layout (:func:`~sglang_echo.drafters.checkpoint.read_weights`:
    single or sharded safetensors or ``.bin``)."""
    w = read_weights(Path(target))
    embed = w["model.embed_tokens.weight"].float()
    return TargetWeights(
        json.loads((Path(target) / "config.json").read_text()),
        embed,
        w.get("lm_head.weight", embed).float(),
        w["model.norm.weight"].float(),
    )
