"""Draft-head checkpoints on disk: ``config.json`` + ``model*.safetensors``, the layout sglang,
SpecForge and z-lab/dflash read. Only safetensors are read: never a pickle.

Each head (:mod:`.eagle3_head`, :mod:`.dart_head`, :mod:`.dflash_head`) owns its config and its
tensor names (``to_hf`` / ``from_hf``, ``export_state`` / ``import_state``); this module owns the
files, so all three fail the same way on a directory that is not a checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor


def read_config(path: Path, kind: str) -> dict:
    """``path/config.json``; ``kind`` names the head in the error when it is missing."""
    cfg_file = Path(path) / "config.json"
    if not cfg_file.exists():
        raise FileNotFoundError(f"{path}: no config.json (not a {kind} head directory)")
    return json.loads(cfg_file.read_text())


def read_weights(path: Path) -> dict[str, Tensor]:
    """Every ``model*.safetensors`` shard of ``path``, floating tensors upcast to fp32 (the heads
    import in fp32 and are cast to the target's dtype afterwards). Other files are left alone:
    DART keeps its n-gram trie, also a safetensors file, next to the head."""
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("model*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no model.safetensors")
    tensors: dict[str, Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}


def write_checkpoint(out: Path, head, dtype: torch.dtype, extra_config: dict | None = None) -> None:
    """``head`` in ``out`` (created if needed): its ``export_state(dtype)`` as ``model.safetensors``
    and its ``cfg.to_hf`` as ``config.json``, which names the stored dtype as Hugging Face spells
    it (``"bfloat16"``)."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    hf_config = head.cfg.to_hf({"dtype": str(dtype).removeprefix("torch."), **(extra_config or {})})
    save_file(head.export_state(dtype), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
