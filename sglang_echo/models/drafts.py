"""Draft heads `make serve` uses until a trained EAGLE-3 head for the target ships.

:func:`early_exit_draft` writes an EAGLE-3-format head built from the target's own weights, with
no training: sglang feeds an EAGLE-3 head the residual stream before target layers
``[2, L/2, L-3]``; this head's FC keeps only the deepest of them, its one decoder layer has zero
output projections (an identity on the residual), and its norm and LM head are the target's. So
it drafts what the first ``L-3`` layers already predict, over the full vocabulary. Deeper draft
steps repeat the first step's guess, which the verifier (and ECHO's gates) will reject; it is a
plumbing-grade, honest drafter, not a substitute for a trained head.
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
