"""Self-distillation data on disk: token-id rows in safetensors shards (never pickle).

A row is one prompt with the target's answer: its token ids and the prompt's length. A shard holds
``input_ids`` (every row's ids, concatenated), ``lengths`` and ``prompt_lengths`` (int32); it is
written to a temporary name and renamed, so a shard that exists is whole.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def shard_path(out: Path, index: int) -> Path:
    """The ``index``-th shard of a data directory (its place in the prompt slice)."""
    return out / f"shard-{index:05d}.safetensors"


def write_shard(path: Path, rows: list[tuple[list[int], int]]) -> None:
    ids = torch.tensor([t for seq, _ in rows for t in seq], dtype=torch.int32)
    lens = torch.tensor([len(seq) for seq, _ in rows], dtype=torch.int32)
    prompt_lens = torch.tensor([p for _, p in rows], dtype=torch.int32)
    tmp = path.with_suffix(".tmp")
    save_file({"input_ids": ids, "lengths": lens, "prompt_lengths": prompt_lens}, str(tmp))
    tmp.rename(path)


def read_shard(shard: Path) -> list[tuple[torch.Tensor, int]]:
    """(sequence ids, prompt length) of every row in one shard."""
    t = load_file(str(shard))
    return [
        (seq, int(p))
        for seq, p in zip(torch.split(t["input_ids"].long(), t["lengths"].tolist()), t["prompt_lengths"].tolist())
    ]


def read_shards(data_dir: str | Path) -> list[tuple[torch.Tensor, int]]:
    """Every (sequence ids, prompt length) in a data directory."""
    return [row for shard in sorted(Path(data_dir).glob("shard-*.safetensors")) for row in read_shard(shard)]
