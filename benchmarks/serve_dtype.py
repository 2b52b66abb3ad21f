"""Which dtype should a CPU serve SmolLM2 in? Plain-decoding servers per dtype, side by side.

sglang serves a checkpoint in its own dtype (``--dtype auto``), except that it turns a float32
checkpoint into float16. On CPUs without bf16/fp16 dot-product units (AVX2, AVX-512 without
BF16) both half types run through slow conversion paths, so the choice decides throughput. This
starts one no-speculation server per dtype, all at once, and runs each concurrency level server
after server (the order alternating per pass), so every ratio spans about a minute of the host::

    python benchmarks/serve_dtype.py --dtypes bfloat16,float32 --concurrency 1,8,32 --repeats 2 \\
        --out benchmarks/results/serve-smollm2-dtype
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from contextlib import ExitStack
from pathlib import Path

from sglang_echo.bench.machine import describe
from sglang_echo.bench.serve import _one_level
from sglang_echo.models.prepare import prepare
from sglang_echo.models.prompts import load_mixed
from sglang_echo.serve.flags import ServerOptions
from sglang_echo.serve.server import SGLangServer, find_free_port_pair


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="bfloat16,float32", help="checkpoint dtypes served (prepared once each)")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--per-set", type=int, default=4, help="prompts per dev set (chat, math, summarisation, HumanEval)")
    ap.add_argument("--rounds", type=int, default=1, help="requests per level = rounds x max(concurrency, prompts)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    dtypes = args.dtypes.split(",")
    levels = [int(c) for c in args.concurrency.split(",")]
    models = {d: prepare(dtype=d).path for d in dtypes}
    tok = AutoTokenizer.from_pretrained(models[dtypes[0]])
    pool = [p.as_text(tok) for p in load_mixed(args.per_set)]
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    with ExitStack() as stack:
        servers = {}
        for d in dtypes:
            port = find_free_port_pair(31400, 31499)
            opts = ServerOptions(model_path=models[d], port=port, dtype=d, max_running_requests=max(levels))
            servers[d] = stack.enter_context(SGLangServer(opts, log_path=args.out / f"server-{d}.log"))
        for rep in range(args.repeats):
            for c in levels:
                n = args.rounds * max(c, len(pool))
                texts = [pool[i % len(pool)] for i in range(n)]
                for d in dtypes if rep % 2 == 0 else dtypes[::-1]:
                    seconds, gens, _ = _one_level(servers[d].base_url, texts, c, [args.max_new] * n)
                    tokens = sum(len(g.output_ids) for g in gens)
                    runs.append(
                        {
                            "dtype": d,
                            "concurrency": c,
                            "repeat": rep,
                            "requests": n,
                            "tokens": tokens,
                            "seconds": round(seconds, 3),
                            "tokens_per_s": round(tokens / seconds, 2),
                        }
                    )
                    print(json.dumps(runs[-1]), flush=True)
    base = dtypes[0]
    rows = [
        "| concurrency | "
        + " | ".join(f"{d} tok/s" for d in dtypes)
        + " | "
        + " | ".join(f"{d} / {base}" for d in dtypes[1:])
        + " |",
        "| --- |" + " --- |" * (2 * len(dtypes) - 1),
    ]
    for c in levels:
        tps = {d: [r["tokens_per_s"] for r in runs if r["dtype"] == d and r["concurrency"] == c] for d in dtypes}
        ratios = {d: [a / b for a, b in zip(tps[d], tps[base])] for d in dtypes[1:]}
        rows.append(
            f"| {c} | "
            + " | ".join(" / ".join(f"{v:.1f}" for v in tps[d]) for d in dtypes)
            + " | "
            + " | ".join(
                f"{statistics.median(ratios[d]):.2f}x (" + " / ".join(f"{v:.2f}" for v in ratios[d]) + ")"
                for d in dtypes[1:]
            )
            + " |"
        )
    table = "\n".join(rows)
    print(table)
    (args.out / "serve_dtype.json").write_text(
        json.dumps(
            {
                "command": "python benchmarks/serve_dtype.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                "machine": describe(),
                "settings": vars(args) | {"out": str(args.out)},
                "runs": runs,
            },
            indent=1,
        )
        + "\n"
    )
    (args.out / "serve_dtype.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
