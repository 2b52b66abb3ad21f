"""DFlash training attention: dense block-diagonal mask vs :func:`grouped_block_attention`, side by side.

A DFlash training batch packs every anchor's block of a sequence after its context in one forward
(``sglang_echo.training.dflash.block_hidden``). With a dense mask every block position scores all
``T + N * bs`` keys; grouped attention scores ``T + bs``. This times forward + backward of the draft
layers for both on the same inputs (SmolLM2 geometry, random weights, bf16 autocast as the trainer
runs), then one whole ``dflash_loss`` step, and prints the ratios::

    python benchmarks/dflash_train_attention.py --block-sizes 8,16 --threads 2 \\
        --out benchmarks/results/dflash-train-cpu
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import Tensor

from sglang_echo.drafters.dflash_head import DFlashConfig, DFlashHead
from sglang_echo.training.batches import collate
from sglang_echo.training.dflash import AnchorSampler, block_inputs, default_gamma, dflash_loss
from sglang_echo.training.features import Sequence

HEAD_CONFIG = Path(__file__).resolve().parents[1] / "sglang_echo/assets/dflash-smollm2-135m-instruct/config.json"


def make_inputs(bs: int, seqs: int, length: int, prompt: int, seed: int = 0):
    raw = json.loads(HEAD_CONFIG.read_text())  # the shipped head's geometry, at block size `bs`
    raw["block_size"], raw["dflash_config"] = bs, {**raw["dflash_config"], "block_size": bs}
    cfg = DFlashConfig.from_hf(raw)
    g = torch.Generator().manual_seed(seed)
    V, H = cfg.vocab_size, cfg.hidden_size
    head = DFlashHead(cfg, torch.randn(V, H, generator=g) * 0.02, torch.randn(V, H, generator=g) * 0.02)
    batch = collate(
        [
            Sequence(
                torch.randint(0, V, (length,), generator=g),
                prompt_len=prompt,
                features=torch.randn(length, 3 * H, generator=g),
            )
            for _ in range(seqs)
        ]
    )
    anchors, keep = AnchorSampler(seed=seed).sample(batch, training=True)
    return head.train(), batch, anchors, keep


def dense_block_mask(ctx_mask: Tensor, bs: int) -> Tensor:
    """The dense mask the trainer used before: the context part, then a block-diagonal ``[S, S]``."""
    B, _, S, _ = ctx_mask.shape
    blk = torch.arange(S) // bs
    return torch.cat([ctx_mask, (blk[:, None] == blk[None, :]).expand(B, 1, S, S)], -1)


def timed(fn, reps: int) -> float:
    fn()  # warm-up
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def run(bs: int, args) -> dict:
    head, batch, anchors, keep = make_inputs(bs, args.seqs, args.length, args.prompt)
    with torch.no_grad():  # the draft layers alone are timed: no gradient into the context K/V
        blocks, pos, kv, ctx_mask = block_inputs(head, batch, anchors, keep)
    dense = dense_block_mask(ctx_mask, bs)

    def layers(grouped: bool):
        def step():
            head.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                hid = (
                    head.forward_blocks(blocks, pos, kv, ctx_mask, group=bs)
                    if grouped
                    else head.forward_blocks(blocks, pos, kv, dense)
                )
            hid.float().square().mean().backward()

        return step

    def loss_step():
        head.zero_grad(set_to_none=True)
        loss, _, _ = dflash_loss(head, batch, AnchorSampler(seed=1), default_gamma(bs), lm_head_dtype=torch.bfloat16)
        loss.backward()

    dense_s, grouped_s = timed(layers(False), args.reps), timed(layers(True), args.reps)
    return {
        "block_size": bs,
        "anchors_per_seq": anchors.shape[1],
        "block_positions_per_seq": anchors.shape[1] * bs,
        "dense_layers_s": dense_s,
        "grouped_layers_s": grouped_s,
        "speedup": dense_s / grouped_s,
        "loss_step_grouped_s": timed(loss_step, args.reps),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--block-sizes", default="8,16")
    ap.add_argument("--seqs", type=int, default=20, help="sequences per batch (the trainer's 4096 tokens / ~207)")
    ap.add_argument("--length", type=int, default=208, help="tokens per sequence (self-distilled data: ~207)")
    ap.add_argument("--prompt", type=int, default=48)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [run(int(b), args) for b in args.block_sizes.split(",")]
    lines = [
        "| block size | block positions / seq | dense mask fwd+bwd (s) | grouped fwd+bwd (s) | speedup "
        "| whole loss step, grouped (s) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r['block_size']} | {r['block_positions_per_seq']} | {r['dense_layers_s']:.3f} "
        f"| {r['grouped_layers_s']:.3f} "
        f"| {r['speedup']:.2f}x | {r['loss_step_grouped_s']:.3f} |"
        for r in rows
    ]
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {
            "command": "python " + " ".join(["benchmarks/dflash_train_attention.py", *(argv or sys.argv[1:])]),
            "machine": f"{platform.processor() or platform.machine()}, {args.threads} threads, "
            f"torch {torch.__version__}",
            "seqs": args.seqs,
            "length": args.length,
            "prompt": args.prompt,
            "reps": args.reps,
            "rows": rows,
        }
        (args.out / "attention.json").write_text(json.dumps(meta, indent=2) + "\n")
        (args.out / "attention.md").write_text(
            f"# DFlash training attention on the CPU\n\n`{meta['command']}` "
            f"({meta['machine']}; median of {args.reps})\n\n" + "\n".join(lines) + "\n"
        )


if __name__ == "__main__":
    main()
