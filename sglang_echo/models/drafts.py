"""Draft heads `make serve` uses until a trained EAGLE-3 head for the target ships.

:func:`early_exit_draft` writes an EAGLE-3-format head built from the target's own weights, with
no training: sglang feeds an EAGLE-3 head the residual stream before target layers
``[2, L/2, L-3]``; this head's FC keeps only the deepest of them, its one decoder layer has zero
output projections (an identity on the residual), and its norm and LM head are the target's.

It is plumbing-grade, not a useful drafter, and the measurements say so (MAT about 1.1 on
SmolLM2, ``benchmarks/results/``): EAGLE-3 pairs the root token ``x_n`` with the target's hidden
state at position ``n-1``, whose early exit predicts ``x_n`` itself rather than ``x_{n+1}``, so a
draft is accepted only where the text repeats a token. It exercises every code path (drafting,
trees, verification, KV commit) with real acceptances, and is lossless like any drafter.
"""

from __future__ import annotations

import json
from pathlib import Path

from .cache import models_dir
from .tiny import write_tiny_eagle3_draft


def early_exit_draft(target_dir: Path, out: Path | None = None) -> Path:
    """The early-exit head for ``target_dir`` (cached next to the prepared models)."""
    target_dir = Path(target_dir)
    vocab = json.loads((target_dir / "config.json").read_text())["vocab_size"]
    out = out or models_dir() / f"{target_dir.name}-early-exit-eagle3"
    write_tiny_eagle3_draft(out, target_dir, draft_vocab_size=vocab, init="early_exit", dtype="bfloat16")
    return out
