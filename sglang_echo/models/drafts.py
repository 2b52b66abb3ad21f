"""The trained draft heads that ship, staged for the prepared target.

:func:`stage_head` / :func:`shipped_head` stage what ``make serve`` and the benchmarks use: the
EAGLE-3, DART and DFlash heads trained for SmolLM2-135M-Instruct by ``echo-train-drafter``
(``sglang_echo/assets/``, each with its model card; :data:`SHIPPED`). A head is staged into the
cache next to the target with the target's tokenizer files, because sglang's draft runner loads a
tokenizer from the draft directory.

Tests that need a head without training write one with
``models.tiny.write_tiny_eagle3_draft(..., init="early_exit")``: the target's own weights (FC
keeps the deepest captured state, the decoder layer is an identity, norm and LM head are the
target's). It is plumbing-grade: EAGLE-3 pairs the root token ``x_n`` with the hidden state at
``n-1``, whose early exit predicts ``x_n`` itself, so it is accepted only where text repeats (MAT
about 1.1).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from ..drafters.checkpoint import CheckpointError, find_weights
from ..drafters.dart_head import TRIE_FILE
from .cache import atomic_dir, is_fresh, locked, models_dir
from .tiny import copy_tokenizer

ASSETS = Path(__file__).resolve().parent.parent / "assets"
SMOLLM2_EAGLE3 = ASSETS / "eagle3-smollm2-135m-instruct"
SMOLLM2_DART = ASSETS / "dart-smollm2-135m-instruct"
SMOLLM2_DFLASH = ASSETS / "dflash-smollm2-135m-instruct"
# The head each drafter serves SmolLM2 with when none is given (make serve, echo-calibrate, echo-bench).
SHIPPED = {"eagle3": SMOLLM2_EAGLE3, "dart": SMOLLM2_DART, "dflash": SMOLLM2_DFLASH}
DRAFTER_NAMES = {"eagle3": "EAGLE-3", "dart": "DART", "dflash": "DFlash", "ngram": "n-gram"}
OPTIONAL_FILES = (TRIE_FILE,)  # DART's n-gram trie, read next to its head


class DraftMismatch(ValueError):
    """The head cannot draft for this target: it is no head folder, or was trained for another target."""


def head_files(head_dir: Path) -> tuple[str, ...]:
    """The files that make up the head folder ``head_dir``, relative to it: ``config.json``, its
    weights in whichever layout they are (``drafters.checkpoint.find_weights``) and DART's trie."""
    try:
        weights = find_weights(head_dir)
    except CheckpointError as e:
        raise DraftMismatch(str(e)) from None
    names = tuple(str(p.relative_to(head_dir)) for p in weights.paths)
    return ("config.json",) + names + tuple(f for f in OPTIONAL_FILES if (head_dir / f).is_file())


def check_head_for(target_dir: Path, head_dir: Path) -> None:
    """A head folder (config.json and weights) that drafts in the target's vocabulary and reads
    its hidden size (DraftMismatch)."""
    if not (head_dir / "config.json").is_file():
        raise DraftMismatch(f"{head_dir}: no config.json there")
    tcfg = json.loads((target_dir / "config.json").read_text())
    hcfg = json.loads((head_dir / "config.json").read_text())
    for key in ("hidden_size", "vocab_size"):
        if tcfg.get(key) != hcfg.get(key):
            raise DraftMismatch(
                f"{head_dir.name} was trained for a target with {key}={hcfg.get(key)}, "
                f"{target_dir} has {tcfg.get(key)}: pass a draft head for this target"
            )
    head_files(head_dir)  # and its weights are there, in a layout the heads read


def stage_head(target_dir: Path, head_dir: Path = SMOLLM2_EAGLE3) -> Path:
    """A shipped head (the EAGLE-3 one by default; ``SMOLLM2_DART``) staged for ``target_dir``
    with the target's tokenizer (checked against its geometry; cached)."""
    target_dir, head_dir = Path(target_dir), Path(head_dir)
    check_head_for(target_dir, head_dir)
    out = models_dir() / f"{target_dir.name}-{head_dir.name}"
    files = head_files(head_dir)
    # By content, not size: a retrained head has the same sizes as the one staged before it.
    fp = json.dumps(
        {"head": {f: hashlib.sha256((head_dir / f).read_bytes()).hexdigest() for f in files}, "target": str(target_dir)}
    )
    with locked(out):
        if not is_fresh(out, fp):
            with atomic_dir(out, {"fingerprint": fp}) as tmp:
                for f in files:
                    shutil.copy2(head_dir / f, tmp / f)
                copy_tokenizer(target_dir, tmp)
    return out


def shipped_head(target_dir: Path, drafter: str) -> Path:
    """The shipped head of ``drafter`` staged for ``target_dir`` (DraftMismatch if there is none)."""
    head = SHIPPED.get(drafter)
    if head is None or not (head / "config.json").is_file():
        raise DraftMismatch(f"no {drafter} head ships with sglang-echo: pass one (--draft)")
    return stage_head(target_dir, head)
