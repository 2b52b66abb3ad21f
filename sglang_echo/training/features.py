"""Feature capture: the target's hidden states that an EAGLE-3 head reads, for every training token.

For each self-distilled sequence the target runs one teacher-forced forward; the residual stream
*entering* each captured layer (HF ``hidden_states[i]``, what sglang's ``layers_to_capture``
records) is concatenated to ``[T, n * H]`` and stored in fp16 next to the token shards, so every
epoch reuses them instead of re-running the target. Resumable like the data generation: a
finished feature shard is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor
from tqdm import tqdm

from .shards import read_shard


@dataclass
class Sequence:
    tokens: Tensor  # [T] int64: prompt then the target's answer
    prompt_len: int
    features: Tensor  # [T, n * H] fp16


@torch.inference_mode()
def capture(model, seqs: list[Tensor], layers: tuple[int, ...], batch_tokens: int = 4096) -> list[Tensor]:
    """``[T_i, len(layers) * H]`` features per sequence (right-padded batches of similar length)."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out: list[Tensor | None] = [None] * len(seqs)
    i = 0
    while i < len(order):
        T = len(seqs[order[i]])
        j = i + 1
        while j < len(order) and (j - i + 1) * len(seqs[order[j]]) <= batch_tokens:
            j += 1
        idx = order[i:j]
        T = max(len(seqs[k]) for k in idx)
        ids = torch.zeros(len(idx), T, dtype=torch.long)
        mask = torch.zeros(len(idx), T, dtype=torch.long)
        for r, k in enumerate(idx):
            ids[r, : len(seqs[k])], mask[r, : len(seqs[k])] = seqs[k], 1
        hs = _hidden_states(model, ids.to(model.device), mask.to(model.device), max(layers))
        feats = torch.cat([hs[layer] for layer in layers], -1).to("cpu", torch.float16)
        for r, k in enumerate(idx):
            out[k] = feats[r, : len(seqs[k])].clone()
        i = j
    return out  # type: ignore[return-value]


def _hidden_states(model, ids: Tensor, mask: Tensor, deepest: int) -> tuple[Tensor, ...]:
    """HF ``hidden_states`` up to the input of layer ``deepest``, skipping the layers above it and
    the LM head (a quarter of a SmolLM2 forward). One extra layer runs because HF's last entry is
    taken after the final norm."""
    body = model.get_decoder()
    every = body.layers
    body.layers = every[: deepest + 1]
    try:
        return body(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    finally:
        body.layers = every


def feature_path(shard: Path, layers: tuple[int, ...]) -> Path:
    return shard.with_name(shard.stem.replace("shard", "features") + "-L" + "_".join(map(str, layers)) + ".safetensors")


def capture_dir(model, data_dir: Path, layers: tuple[int, ...]) -> None:
    """Write the feature shard of every token shard in ``data_dir`` that lacks one."""
    shards = sorted(Path(data_dir).glob("shard-*.safetensors"))
    for shard in tqdm(shards, desc="feature capture", unit="shard"):
        out = feature_path(shard, layers)
        if out.exists():
            continue
        seqs = [s for s, _ in read_shard(shard)]
        feats = capture(model, seqs, layers)
        tmp = out.with_suffix(".tmp")
        save_file({"features": torch.cat(feats)}, str(tmp))
        tmp.rename(out)


def load_sequences(data_dir: Path, layers: tuple[int, ...]) -> list[Sequence]:
    """Every sequence of ``data_dir`` with its captured features."""
    out = []
    for shard in sorted(Path(data_dir).glob("shard-*.safetensors")):
        fpath = feature_path(shard, layers)
        if not fpath.exists():
            raise FileNotFoundError(f"{fpath}: features not captured (run the capture stage)")
        rows = read_shard(shard)
        feats = torch.split(load_file(str(fpath))["features"], [len(s) for s, _ in rows])
        out += [Sequence(s, p, f) for (s, p), f in zip(rows, feats)]
    return out
