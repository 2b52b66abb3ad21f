"""``echo-build-ngram``: DART's n-gram trie (:mod:`sglang_echo.drafters.ngram_trie`) from a corpus,
counted with the target's tokenizer.

    echo-build-ngram --model TARGET_DIR --out ngram-trie.safetensors INPUT [INPUT ...]

INPUT: a folder of self-distilled shards (``shard-*.safetensors``, token ids), a shard file, a
JSONL file (one object per line with ``text``, ``messages`` (chat, rendered with the tokenizer's
template) or ``tokens``/``input_ids``), or a plain-text file (one document). Never build it from an
evaluation set.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

from sglang_echo.cli_args import Parser, alias, at_least, out_file, positive_int, run, tokenizer_dir
from sglang_echo.drafters.ngram_trie import NGramTrie, NGramTrieError

from .shards import read_shard


def _vocab_size(tokenizer_dir: Path, tok) -> int:
    cfg = Path(tokenizer_dir) / "config.json"
    if cfg.is_file():
        v = json.loads(cfg.read_text()).get("vocab_size")
        if v:
            return int(v)
    return len(tok)


def _shard_docs(shard: Path, answers_only: bool) -> Iterator[Tensor]:
    try:
        rows = read_shard(shard)
    except Exception as e:  # noqa: BLE001
        raise NGramTrieError(
            f"{shard}: not a self-distillation shard (input_ids/lengths/prompt_lengths): {e}"
        ) from None
    for seq, plen in rows:
        yield seq[plen:] if answers_only else seq


def _jsonl_docs(path: Path, tok) -> Iterator[Tensor]:
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise NGramTrieError(f"{path}:{i}: invalid JSON ({e.msg})") from None
            if isinstance(obj, dict) and isinstance(obj.get("tokens", obj.get("input_ids")), list):
                yield torch.tensor(obj.get("tokens", obj.get("input_ids")), dtype=torch.int64)
            elif isinstance(obj, dict) and isinstance(obj.get("text"), str):
                yield torch.tensor(tok(obj["text"], add_special_tokens=False)["input_ids"], dtype=torch.int64)
            elif isinstance(obj, dict) and isinstance(obj.get("messages"), list):
                ids = tok.apply_chat_template(obj["messages"], tokenize=True)
                ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
                yield torch.tensor(ids, dtype=torch.int64)
            else:
                raise NGramTrieError(f"{path}:{i}: expected an object with 'text', 'messages' or 'tokens'")


def _text_doc(path: Path, tok) -> Iterator[Tensor]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise NGramTrieError(f"{path}: not UTF-8 text (inputs: shard dirs/files, .jsonl, text)") from None
    yield torch.tensor(tok(text, add_special_tokens=False)["input_ids"], dtype=torch.int64)


def _shards(folder: Path) -> list[Path]:
    shards = sorted(folder.glob("shard-*.safetensors"))
    if not shards:
        raise NGramTrieError(f"{folder}: a directory without self-distillation shards (shard-*.safetensors)")
    return shards


def corpus(inputs: list[Path], tok, answers_only: bool = False) -> Iterator[Tensor]:
    """Token sequences of every input (see the module docstring for the formats)."""
    for p in inputs:
        p = Path(p)
        if p.is_dir():
            for s in _shards(p):
                yield from _shard_docs(s, answers_only)
        elif not p.exists():
            raise NGramTrieError(f"{p}: no such file or directory")
        elif p.suffix == ".safetensors":
            yield from _shard_docs(p, answers_only)
        elif p.suffix == ".jsonl":
            yield from _jsonl_docs(p, tok)
        else:
            yield from _text_doc(p, tok)


def _input(text: str) -> Path:
    """An existing file, or a folder holding self-distillation shards."""
    path = Path(text)
    try:
        if path.is_dir():
            _shards(path)
        elif not path.is_file():
            raise NGramTrieError(f"{text}: no such file or directory")
    except NGramTrieError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return path


def parser() -> Parser:
    ap = Parser(prog="echo-build-ngram", description=__doc__.splitlines()[0] + " " + __doc__.splitlines()[1])
    ap.add_argument("inputs", nargs="+", type=_input, help="shard folders/files, .jsonl or text files")
    ap.add_argument(
        "--model",
        type=tokenizer_dir,
        required=True,
        help="the target's model folder (its tokenizer; config.json for the vocabulary size)",
    )
    ap.add_argument("--out", type=out_file, required=True, help="output .safetensors file")
    ap.add_argument("--order", type=at_least(1), default=3, help="n-gram order (DART: 3)")
    ap.add_argument("--min-count", type=positive_int, default=1, help="drop n-grams (n >= 2) seen fewer times")
    ap.add_argument("--answers-only", action="store_true", help="shards: only the answers, not the prompts")
    alias(ap, "--model", "--tokenizer")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    return run(ap.prog, lambda: _build(args), args.debug)


def _build(args: argparse.Namespace) -> None:
    from tqdm import tqdm
    from transformers import AutoTokenizer

    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(str(args.model))
    docs = tqdm(corpus(args.inputs, tok, args.answers_only), desc="n-grams", unit="doc")
    trie = NGramTrie.build(
        docs,
        _vocab_size(args.model, tok),
        args.order,
        args.min_count,
        meta={
            "tokenizer": str(args.model),
            "source": ",".join(str(p) for p in args.inputs),
            "answers_only": args.answers_only,
        },
    )
    trie.save(args.out)
    levels = ", ".join(f"{n}-grams {k.numel()}" for n, k in enumerate(trie.keys, 1))
    print(
        f"wrote {args.out}: {trie.meta['sequences']} sequences, {trie.meta['tokens']} tokens, {levels}; "
        f"{args.out.stat().st_size / 1e6:.2f} MB in {time.time() - t0:.1f}s"
    )


if __name__ == "__main__":
    raise SystemExit(main())
