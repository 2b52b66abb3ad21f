"""Self-distillation data: the target answers the training prompt pool (greedy, like serving at
temperature 0), and the token ids are stored in safetensors shards.

    python -m sglang_echo.training.datagen --model DIR --out DIR [--prompts 2000 --max-new 192]

Resumable: finished shards are skipped, so an interrupted run continues where it stopped.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from sglang_echo.models.prompts import Prompt
from sglang_echo.platform.packed_linear import pack_linears

from .prompt_pool import build_pool, prompt_text


def load_target(model_dir: str, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval().to(device)
    pack_linears(model)  # the CPU platform's packed GEMMs: faster, and what the CPU server computes
    return tok, model


@torch.inference_mode()
def answer(tok, model, prompts: list[Prompt], max_new: int) -> list[tuple[list[int], int]]:
    """(prompt + answer token ids, prompt length) per prompt, padding stripped.

    Chat prompts get the chat template, raw ones (code completions) none, tokenized as the
    evaluation loop tokenizes them (``bench.acceptance``)."""
    ids = [tok(p.as_text(tok), add_special_tokens=not p.is_chat)["input_ids"] for p in prompts]
    T = max(map(len, ids))
    input_ids = torch.full((len(ids), T), tok.pad_token_id, dtype=torch.long)
    attention = torch.zeros(len(ids), T, dtype=torch.long)
    for i, row in enumerate(ids):  # left padding: every row's last prompt token is at T - 1
        input_ids[i, T - len(row) :], attention[i, T - len(row) :] = torch.tensor(row), 1
    dev = model.device
    out = model.generate(input_ids=input_ids.to(dev), attention_mask=attention.to(dev), max_new_tokens=max_new, do_sample=False,
                         pad_token_id=tok.pad_token_id)
    rows = []
    for i, prompt in enumerate(ids):
        gen = out[i, T:].cpu().tolist()
        if tok.eos_token_id in gen:
            gen = gen[: gen.index(tok.eos_token_id) + 1]
        rows.append((prompt + gen, len(prompt)))
    return rows


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
    return [(seq, int(p)) for seq, p in zip(torch.split(t["input_ids"].long(), t["lengths"].tolist()), t["prompt_lengths"].tolist())]


def read_shards(data_dir: str | Path) -> list[tuple[torch.Tensor, int]]:
    """Every (sequence ids, prompt length) in a data directory."""
    return [row for shard in sorted(Path(data_dir).glob("shard-*.safetensors")) for row in read_shard(shard)]


def generate(model_dir: str | Path, out: str | Path, prompts: int, max_new: int = 192, batch: int = 32,
             shard_size: int = 128, seed: int = 0, dtype: str = "float32", device: str = "cpu") -> None:
    """Answer ``prompts`` pool prompts with the target into ``out/shard-*.safetensors`` (resumable)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pool = build_pool(prompts, seed)
    shards = [pool[i : i + shard_size] for i in range(0, len(pool), shard_size)]
    todo = [k for k in range(len(shards)) if not (out / f"shard-{k:05d}.safetensors").exists()]
    if not todo:
        return
    tok, model = load_target(str(model_dir), getattr(torch, dtype), device)
    bar = tqdm(total=len(pool), initial=(len(shards) - len(todo)) * shard_size, desc="self-distillation", unit="prompt")
    for k in todo:
        # similar prompt lengths share a generate call (less left padding); rows keep pool order
        order = sorted(range(len(shards[k])), key=lambda i: len(prompt_text(shards[k][i])))
        rows: list = [None] * len(order)
        for i in range(0, len(order), batch):
            idx = order[i : i + batch]
            for j, row in zip(idx, answer(tok, model, [shards[k][j] for j in idx], max_new)):
                rows[j] = row
            bar.update(len(idx))
        write_shard(out / f"shard-{k:05d}.safetensors", rows)
    bar.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", type=int, default=2000)
    ap.add_argument("--max-new", type=int, default=192)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dtype", default="float32", help="target dtype (float32 is fastest on CPUs without bf16 units)")
    ap.add_argument("--shard-size", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args(argv)
    generate(a.model, a.out, a.prompts, a.max_new, a.batch, a.shard_size, a.seed, a.dtype, a.device)


if __name__ == "__main__":
    main()
