"""Self-distillation data: the target answers the training prompt pool (greedy, like serving at
temperature 0), and the token ids are stored in safetensors shards.

    python -m sglang_echo.training.datagen --model DIR --out DIR [--prompts 2000 --max-new 192]
        [--backend server|hf]

Two backends write the same rows:

* ``server`` (default): the real sglang server (the CPU platform without a GPU) answers every
  prompt with continuous batching, so the data is what the target serves, token for token, and a
  long answer never holds a batch of short ones back;
* ``hf``: transformers' ``generate`` on left-padded batches (no server start-up; the tests' tiny
  targets use it).

Resumable: finished shards are skipped, so an interrupted run continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from tqdm import tqdm

from sglang_echo.models.prompts import Prompt
from sglang_echo.platform.packed_linear import pack_linears
from sglang_echo.serve.flags import resolve_device

from .pool_kinds import KINDS
from .prompt_pool import POOL_VERSION, build_pool, dev_pool, prompt_text
from .shards import shard_path, write_shard

BACKENDS = ("server", "hf")
SERVER_PORTS = (31600, 31699)  # below Linux's ephemeral ports, apart from the test suites' ranges
MANIFEST = "data.json"  # the settings that made a data directory (check_manifest)


def load_target(model_dir: str, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval().to(device)
    pack_linears(model)  # the CPU platform's packed GEMMs: faster, and what the CPU server computes
    return tok, model


def prompt_ids(tok, prompts: list[Prompt]) -> list[list[int]]:
    """Chat prompts get the chat template, raw ones (code completions) none, tokenized as the
    evaluation loop tokenizes them (``bench.acceptance``)."""
    return [tok(p.as_text(tok), add_special_tokens=not p.is_chat)["input_ids"] for p in prompts]


def up_to_eos(prompt: list[int], gen: list[int], eos: int) -> tuple[list[int], int]:
    """One row: the prompt and its answer up to and including the first EOS, and the prompt length."""
    if eos in gen:
        gen = gen[: gen.index(eos) + 1]
    return prompt + gen, len(prompt)


@torch.inference_mode()
def answer(tok, model, prompts: list[Prompt], max_new: int) -> list[tuple[list[int], int]]:
    """(prompt + answer token ids, prompt length) per prompt, padding stripped (``hf`` backend)."""
    ids = prompt_ids(tok, prompts)
    T = max(map(len, ids))
    input_ids = torch.full((len(ids), T), tok.pad_token_id, dtype=torch.long)
    attention = torch.zeros(len(ids), T, dtype=torch.long)
    for i, row in enumerate(ids):  # left padding: every row's last prompt token is at T - 1
        input_ids[i, T - len(row) :], attention[i, T - len(row) :] = torch.tensor(row), 1
    dev = model.device
    out = model.generate(
        input_ids=input_ids.to(dev),
        attention_mask=attention.to(dev),
        max_new_tokens=max_new,
        do_sample=False,
        pad_token_id=tok.pad_token_id,
    )
    return [up_to_eos(prompt, out[i, T:].cpu().tolist(), tok.eos_token_id) for i, prompt in enumerate(ids)]


class ServerAnswers:
    """The ``server`` backend: a no-speculation sglang server of the target, answering greedily.

    Requests go ``concurrency`` at a time; the server batches them continuously. The checkpoint is
    served in ``dtype`` (sglang's ``auto`` would turn a float32 checkpoint into float16)."""

    def __init__(self, model_dir: str | Path, dtype: str, device: str, max_new: int, concurrency: int, log_dir: Path):
        from transformers import AutoTokenizer

        from sglang_echo.serve.flags import CPU_MAX_TOTAL_TOKENS, ServerOptions
        from sglang_echo.serve.server import SGLangServer, find_free_port_pair

        self.tok = AutoTokenizer.from_pretrained(str(model_dir))
        self.concurrency = concurrency
        # KV room for every request in flight (pool prompts are a few hundred tokens at most)
        kv_tokens = max(CPU_MAX_TOTAL_TOKENS, concurrency * (max_new + 512))
        opts = ServerOptions(
            model_path=Path(model_dir),
            port=find_free_port_pair(*SERVER_PORTS),
            dtype=dtype,
            device=device,
            max_running_requests=concurrency,
            max_total_tokens=kv_tokens,
        )
        self.server = SGLangServer(opts, log_path=log_dir / "datagen-server.log")

    def __enter__(self) -> "ServerAnswers":
        self.server.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.server.__exit__(*exc)

    def answer_shards(
        self, shards: list[list[Prompt]], max_new: int, bar: tqdm
    ) -> Iterator[list[tuple[list[int], int]]]:
        """Each shard's rows, in order. Every prompt is queued at once, so the server stays full
        across shard boundaries; an interruption cancels what has not started."""
        from sglang_echo.serve.client import generate

        def one(ids: list[int]) -> tuple[list[int], int]:
            g = generate(self.server.base_url, input_ids=ids, max_new_tokens=max_new, temperature=0.0, timeout=3600)
            bar.update(1)
            return up_to_eos(ids, g.output_ids, self.tok.eos_token_id)

        pool = ThreadPoolExecutor(max_workers=self.concurrency)
        try:
            futures = [[pool.submit(one, ids) for ids in prompt_ids(self.tok, shard)] for shard in shards]
            for shard_futures in futures:
                yield [f.result() for f in shard_futures]
        finally:
            pool.shutdown(wait=False, cancel_futures=True)


class HFAnswers:
    """The ``hf`` backend: transformers' ``generate`` on batches of similar prompt lengths."""

    def __init__(self, model_dir: str | Path, dtype: str, device: str, batch: int):
        self.tok, self.model = load_target(str(model_dir), getattr(torch, dtype), device)
        self.batch = batch

    def __enter__(self) -> "HFAnswers":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def answer_shards(
        self, shards: list[list[Prompt]], max_new: int, bar: tqdm
    ) -> Iterator[list[tuple[list[int], int]]]:
        """Each shard's rows, in order; similar prompt lengths share a ``generate`` call (less left
        padding)."""
        for prompts in shards:
            order = sorted(range(len(prompts)), key=lambda i: len(prompt_text(prompts[i])))
            rows: list = [None] * len(order)
            for i in range(0, len(order), self.batch):
                idx = order[i : i + self.batch]
                for j, row in zip(idx, answer(self.tok, self.model, [prompts[j] for j in idx], max_new)):
                    rows[j] = row
                bar.update(len(idx))
            yield rows


def check_manifest(out: Path, settings: dict) -> None:
    """Shards are named by their place in the pool slice, so a directory only continues the run
    that started it: the settings that decide which prompts and answers a shard holds are recorded
    on the first run (which makes the directory) and must match on every later one (more prompts
    may be added)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / MANIFEST
    if path.exists():
        saved = json.loads(path.read_text())
        if saved != settings:
            raise ValueError(
                f"{out} holds self-distillation data made with {saved}, not {settings}: "
                "use another directory, or the same settings"
            )
    else:
        path.write_text(json.dumps(settings, indent=2) + "\n")


def generate(
    model_dir: str | Path,
    out: str | Path,
    prompts: int,
    max_new: int = 192,
    batch: int = 32,
    shard_size: int = 128,
    seed: int = 0,
    dtype: str = "float32",
    device: str = "cpu",
    backend: str = "server",
    offset: int = 0,
) -> None:
    """Answer pool prompts ``offset .. offset + prompts - 1`` with the target into
    ``out/shard-*.safetensors`` (resumable). An offset past an earlier run's prompts gives new data
    (a smaller pool is a prefix of a larger one).

    ``batch``: requests in flight (``server``) or rows per ``generate`` call (``hf``)."""
    out = Path(out)
    settings = {"offset": offset, "seed": seed, "max_new": max_new, "shard_size": shard_size, "pool": POOL_VERSION}
    check_manifest(out, settings)
    pool = build_pool(offset + prompts, seed)[offset:]
    answer_into(out, pool, model_dir, max_new, batch, shard_size, dtype, device, backend)


def answer_into(
    out: Path,
    prompts: list[Prompt],
    model_dir: str | Path,
    max_new: int,
    batch: int,
    shard_size: int,
    dtype: str,
    device: str,
    backend: str,
) -> None:
    """The target's answers to ``prompts`` in ``out/shard-<k>.safetensors``, ``shard_size``
    prompts a shard; shards that exist are skipped (resumable), no backend starts if none is left."""
    answer_groups({Path(out): prompts}, model_dir, max_new, batch, shard_size, dtype, device, backend)


def answer_groups(
    groups: dict[Path, list[Prompt]],
    model_dir: str | Path,
    max_new: int,
    batch: int,
    shard_size: int,
    dtype: str,
    device: str,
    backend: str,
) -> None:
    """:func:`answer_into` for several folders (each with its prompts) through one backend."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: expected one of {BACKENDS}")
    todo: list[tuple[Path, list[Prompt]]] = []  # (shard path, its prompts) of every missing shard
    for out, prompts in groups.items():
        out.mkdir(parents=True, exist_ok=True)
        for k in range(0, len(prompts), shard_size):
            path = shard_path(out, k // shard_size)
            if not path.exists():
                todo.append((path, prompts[k : k + shard_size]))
    if not todo:
        return
    log_dir = next(iter(groups))
    target = (
        ServerAnswers(model_dir, dtype, device, max_new, batch, log_dir)
        if backend == "server"
        else HFAnswers(model_dir, dtype, device, batch)
    )
    total = sum(len(p) for p in groups.values())
    bar = tqdm(total=total, initial=total - sum(len(p) for _, p in todo), desc="self-distillation", unit="prompt")
    with target:
        for (path, _), rows in zip(todo, target.answer_shards([p for _, p in todo], max_new, bar)):
            write_shard(path, rows)
    bar.close()


def generate_dev(
    model_dir: str | Path,
    out: str | Path,
    per_kind: int,
    max_new: int = 192,
    batch: int = 32,
    seed: int = 0,
    dtype: str = "float32",
    device: str = "cpu",
    backend: str = "server",
) -> dict[str, Path]:
    """The target's answers to ``per_kind`` dev-split prompts of every pool kind (never trained
    on: :func:`~.prompt_pool.dev_pool`), one folder ``out/<kind>`` each (resumable); returns them."""
    out = Path(out)
    settings = {"split": "dev", "per_kind": per_kind, "seed": seed, "max_new": max_new, "pool": POOL_VERSION}
    check_manifest(out, settings)
    groups = {out / kind: dev_pool(kind, per_kind, seed) for kind in KINDS}
    answer_groups(groups, model_dir, max_new, batch, per_kind, dtype, device, backend)
    return {d.name: d for d in groups}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", type=int, default=2000)
    ap.add_argument("--offset", type=int, default=0, help="skip the pool's first prompts (an earlier run's)")
    ap.add_argument("--max-new", type=int, default=192)
    ap.add_argument("--backend", choices=BACKENDS, default="server")
    ap.add_argument("--batch", type=int, default=32, help="requests in flight (server) or per generate call (hf)")
    ap.add_argument("--dtype", default="float32", help="target dtype (float32 is fastest on CPUs without bf16 units)")
    ap.add_argument("--shard-size", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None, help="default: cuda where available, else cpu")
    a = ap.parse_args(argv)
    a.device = resolve_device(a.device)
    generate(
        a.model, a.out, a.prompts, a.max_new, a.batch, a.shard_size, a.seed, a.dtype, a.device, a.backend, a.offset
    )


if __name__ == "__main__":
    main()
