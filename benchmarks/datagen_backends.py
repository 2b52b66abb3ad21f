"""Self-distillation backends side by side: the sglang server vs transformers' ``generate``.

Both answer the same training-pool prompts with the same target, dtype and token budget
(``sglang_echo.training.datagen``); the server keeps ``--server-batch`` requests in flight under
continuous batching, ``generate`` decodes left-padded batches of ``--hf-batch`` prompts of similar
length until the longest answer ends. Prints answer tokens per second of each, their ratio, and how
many rows the two wrote identically (left padding shifts ``generate``'s numerics slightly)::

    python benchmarks/datagen_backends.py --prompts 128 --max-new 192 \\
        --out benchmarks/results/datagen-backends
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from sglang_echo.bench.machine import describe
from sglang_echo.models.prepare import prepare
from sglang_echo.training.datagen import generate
from sglang_echo.training.shards import read_shards


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--max-new", type=int, default=192)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--server-batch", type=int, default=64)
    ap.add_argument("--hf-batch", type=int, default=32)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    model = prepare(dtype=args.dtype).path
    work = Path(tempfile.mkdtemp(prefix="datagen-bench-"))
    runs = {}
    try:
        for backend, batch in (("server", args.server_batch), ("hf", args.hf_batch)):
            t0 = time.perf_counter()
            generate(
                model,
                work / backend,
                args.prompts,
                args.max_new,
                batch=batch,
                shard_size=args.prompts,
                dtype=args.dtype,
                backend=backend,
            )
            seconds = time.perf_counter() - t0  # server start-up included: it is part of the cost
            rows = read_shards(work / backend)
            tokens = sum(len(s) - p for s, p in rows)
            runs[backend] = {
                "batch": batch,
                "seconds": round(seconds, 1),
                "answer_tokens": tokens,
                "tokens_per_s": round(tokens / seconds, 1),
                "rows": rows,
            }
            print(f"{backend}: {tokens} answer tokens in {seconds:.0f} s = {tokens / seconds:.1f} tok/s", flush=True)
        same = sum(int(a[0].equal(b[0])) for a, b in zip(runs["server"]["rows"], runs["hf"]["rows"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratio = runs["server"]["tokens_per_s"] / runs["hf"]["tokens_per_s"]
    print(f"server / hf: {ratio:.2f}x; identical rows: {same} / {args.prompts}")
    for r in runs.values():
        del r["rows"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "datagen_backends.json").write_text(
        json.dumps(
            {
                "command": "python benchmarks/datagen_backends.py "
                + " ".join(argv if argv is not None else sys.argv[1:]),
                "machine": describe(),
                "settings": {**vars(args), "out": str(args.out), "model": str(model)},
                "runs": runs,
                "server_over_hf": round(ratio, 2),
                "identical_rows": same,
            },
            indent=1,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
