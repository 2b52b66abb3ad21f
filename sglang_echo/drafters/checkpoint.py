"""Draft-head checkpoints on disk: ``config.json`` plus the weights in any layout the Hub uses for
them, so a head published for sglang, vLLM or SpecForge loads as it was published.

Weights, in the order they are looked for (:func:`find_weights`; safetensors win where both exist):

* ``model.safetensors.index.json`` and the shards its ``weight_map`` names;
* ``model.safetensors``;
* ``model-*.safetensors`` shards without an index;
* the same three for PyTorch pickles: ``pytorch_model.bin.index.json``, ``pytorch_model.bin``,
  ``pytorch_model-*.bin``.

A ``.bin`` is read only through ``torch.load(weights_only=True)``, torch's restricted unpickler,
which builds tensors and plain containers and refuses any other global: a file that needs full
unpickling (one that could run code) is refused, never executed. Other files in the folder are
left alone (DART keeps its n-gram trie, also a safetensors file, next to the head).

Each head (:mod:`.eagle3_head`, :mod:`.dart_head`, :mod:`.dflash_head`) owns its config and its
tensor names (``to_hf`` / ``from_hf``, ``export_state`` / ``import_state``); this module owns the
files, so all three read the same layouts and fail the same one-line way on a folder that is not a
checkpoint (:class:`CheckpointError`).
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

# (index, single file, shard glob) per format, in order of preference.
LAYOUTS = {
    "safetensors": ("model.safetensors.index.json", "model.safetensors", "model-*.safetensors"),
    "bin": ("pytorch_model.bin.index.json", "pytorch_model.bin", "pytorch_model-*.bin"),
}
LOOKED_FOR = ", ".join(name for layout in LAYOUTS.values() for name in layout)


class CheckpointError(ValueError):
    """A head folder whose weights cannot be read: missing, unreadable, or refused (one line)."""


class MissingWeights(CheckpointError, FileNotFoundError):
    """No weight file of any supported layout, or a shard an index names is missing."""


@dataclass(frozen=True)
class WeightFiles:
    """The weight files of one head folder: ``format`` (a :data:`LAYOUTS` key), the files to read,
    and the index that named them (None for a single file or unindexed shards)."""

    format: str
    files: tuple[Path, ...]
    index: Optional[Path] = None

    @property
    def paths(self) -> tuple[Path, ...]:
        """Every file that makes up the weights (what staging copies): the index, then the files."""
        return ((self.index,) if self.index else ()) + self.files


def _indexed(index: Path) -> tuple[Path, ...]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(
            f"{index}: not a weight index (needs a weight_map of tensor -> file: {type(e).__name__}: {e})"
        ) from None
    outside = [n for n in names if not isinstance(n, str) or Path(n).name != n]
    if outside:
        raise CheckpointError(f"{index}: shard names must be files beside the index, not {outside}")
    missing = [n for n in names if not (index.parent / n).is_file()]
    if missing:
        raise MissingWeights(f"{index}: names shard(s) missing from {index.parent}: {', '.join(missing)}")
    return tuple(index.parent / n for n in names)


def find_weights(path: str | Path) -> WeightFiles:
    """The weight files of the head folder ``path`` (see the module docstring for the order);
    :class:`MissingWeights` naming the folder and every name looked for where there is none."""
    root = Path(path)
    if not root.is_dir():
        raise MissingWeights(f"{root}: not a directory (a draft head is a folder with config.json and weights)")
    for fmt, (index, single, shards) in LAYOUTS.items():
        if (root / index).is_file():
            return WeightFiles(fmt, _indexed(root / index), root / index)
        if (root / single).is_file():
            return WeightFiles(fmt, (root / single,))
        found = tuple(sorted(root.glob(shards)))
        if found:
            return WeightFiles(fmt, found)
    raise MissingWeights(f"{root}: no head weights (looked for {LOOKED_FOR})")


def read_config(path: Path, kind: str) -> dict:
    """``path/config.json``; ``kind`` names the head in the error when it is missing."""
    cfg_file = Path(path) / "config.json"
    if not Path(path).is_dir():
        raise MissingWeights(f"{path}: not a directory (a {kind} head is a folder with config.json and weights)")
    if not cfg_file.exists():
        raise FileNotFoundError(f"{path}: no config.json (not a {kind} head directory)")
    try:
        return json.loads(cfg_file.read_text())
    except ValueError as e:
        raise CheckpointError(f"{cfg_file}: not valid JSON ({e})") from None


def _read_safetensors(f: Path) -> dict[str, Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(f))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{f}: not a readable safetensors file ({_why(e)})") from None


def _why(e: BaseException) -> str:
    """The telling part of a torch.load error, on one line (torch's own messages run to paragraphs)."""
    text = str(e)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1].split("Please use", 1)[0].split("Check the doc", 1)[0]
    return " ".join(text.split()) or type(e).__name__


def _read_bin(f: Path) -> dict[str, Tensor]:
    """A PyTorch state dict through torch's restricted unpickler only (``weights_only=True``)."""
    try:
        state = torch.load(str(f), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{f}: refused by torch's restricted loader (weights_only=True: {_why(e)}); "
            "a .bin that needs full unpickling could run code and is never loaded: "
            "convert it to safetensors where you trust it"
        ) from None
    except (RuntimeError, OSError, EOFError, ValueError) as e:
        raise CheckpointError(f"{f}: not a readable PyTorch weights file ({type(e).__name__}: {_why(e)})") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()):
        raise CheckpointError(f"{f}: not a state dict (a flat mapping of tensor name -> tensor)")
    return state


def read_weights(path: Path) -> dict[str, Tensor]:
    """Every tensor of the head folder ``path`` (:func:`find_weights`), floating tensors upcast to
    fp32 (the heads import in fp32 and are cast to the target's dtype afterwards)."""
    found = find_weights(path)
    read = _read_safetensors if found.format == "safetensors" else _read_bin
    tensors: dict[str, Tensor] = {}
    for f in found.files:
        tensors.update(read(f))
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
