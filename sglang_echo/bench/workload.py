"""What `echo-bench serve` sends: the prompt pool (texts from the prompt sets, or random token ids)
and the model folder a started server loads.

* Text prompts: the mixed prompt sets rendered with the target's chat template (the default).
* ``--token-prompts N:LEN``: N prompts of LEN token ids drawn uniformly from the target's vocabulary
  by ``numpy.random.default_rng(seed)``, sent as ``input_ids``. They need no tokenizer, so a server
  can start with ``--skip-tokenizer-init`` on a bare config (``--model`` with ``--load-format
  dummy``), where SmolLM2's tokenizer would not match the model's vocabulary.
* ``--model``: a Hugging Face model folder, or a bare ``config.json``-style file (e.g.
  ``benchmarks/configs/llama-3.1-8b.json``), which is staged as a folder of its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class PromptItem:
    """One prompt: its id and set, and either its text or its token ids."""

    id: str
    dataset: str
    text: str | None = None
    input_ids: tuple[int, ...] | None = None

    @property
    def prompt_tokens(self) -> int | None:
        """Known without a tokenizer for token prompts; the server counts text prompts."""
        return len(self.input_ids) if self.input_ids is not None else None


def parse_token_prompts(text: str) -> tuple[int, int]:
    """``--token-prompts N:LEN`` as (N, LEN), both positive (ValueError naming the option)."""
    n, sep, length = text.partition(":")
    try:
        pair = (int(n), int(length)) if sep else None
    except ValueError:
        pair = None
    if pair is None or min(pair) < 1:
        raise ValueError(f"--token-prompts {text!r}: expected N:LEN, two positive integers (e.g. 64:512)")
    return pair


def token_prompts(n: int, length: int, vocab_size: int, seed: int = 0) -> list[PromptItem]:
    """``n`` prompts of ``length`` ids uniform in ``[0, vocab_size)``, the same for a given seed."""
    ids = np.random.default_rng(seed).integers(0, vocab_size, size=(n, length))
    return [PromptItem(f"tokens/{i}", "tokens", input_ids=tuple(int(t) for t in row)) for i, row in enumerate(ids)]


def text_prompts(per_set: int, tokenizer, names=None) -> list[PromptItem]:
    """``per_set`` prompts of each prompt set (``names``; default every built-in one), rendered
    for ``tokenizer`` (chat ones with its template)."""
    from ..models.prompts import DATASETS, load_mixed

    return [PromptItem(p.id, p.dataset, text=p.as_text(tokenizer)) for p in load_mixed(per_set, names or DATASETS)]


def cycle(items: list, n: int) -> list:
    """The first ``n`` of ``items`` repeated as often as needed."""
    return (items * (1 + n // len(items)))[:n]


def model_folder(path: Path, what: str = "--model") -> Path:
    """A folder sglang can load: ``path`` itself if it is one (it must hold ``config.json``), or a
    bare config file staged as ``<tmp>/sglang-echo-configs/<stem>-<hash>/config.json``
    (ValueError naming ``what`` and the path)."""
    path = Path(path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{what} {path}: no config.json there")
        return path.resolve()
    if not path.is_file():
        raise ValueError(f"{what} {path}: no such folder or config file")
    text = path.read_text()
    try:
        json.loads(text)
    except ValueError:
        raise ValueError(f"{what} {path}: not a JSON config") from None
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    out = Path(tempfile.gettempdir()) / "sglang-echo-configs" / f"{path.stem}-{digest}"
    if not (out / "config.json").is_file():
        tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "config.json").write_text(text)
        try:
            tmp.rename(out)
        except OSError:  # another process staged it first: same content
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def vocab_size(folder: Path) -> int:
    """The vocabulary size in ``folder``'s ``config.json`` (a multimodal config's text part too)."""
    cfg = json.loads((Path(folder) / "config.json").read_text())
    size = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"{folder}/config.json: no vocab_size to draw token prompts from")
    return size
