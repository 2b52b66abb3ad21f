"""EAGLE draft-decode attention on the CPU platform: one causal row per lane against each request's
lanes as queries over its one KV row (`sglang_echo/platform/attention/draft.py`), side by side.

Both layouts compute the same attention (`tests/platform/test_attention.py` checks it); this
times one draft layer's attention (mask and gather included) at SmolLM2's head shape, with
`make serve`'s malloc settings applied when the process starts (run it as below), and prints
the ratio per shape.

    MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296 \
        .venv/bin/python benchmarks/draft_attention.py [--repeats 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from sglang_echo.platform.attention.draft import build_draft_decode_metadata, draft_lane_metadata, lane_rows_metadata
from sglang_echo.platform.attention.paged_sdpa import causal_mask, paged_sdpa

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64  # SmolLM2-135M and its draft heads
SHAPES = [(1, 300), (8, 300), (8, 600), (32, 300), (64, 300)]  # (requests, prefix tokens)


def one_row_per_lane(q, kb, vb, r2t, req, seq, topk, steps, step):
    md = lane_rows_metadata(build_draft_decode_metadata(r2t, req, seq, topk, steps), seq, topk, step)
    visible = causal_mask(md.q_lens, md.kv_lens, 1, int(md.kv_lens.max()))
    return paged_sdpa(q, kb, vb, md.req_to_token, md.req_pool_indices, md.q_lens, md.kv_lens, visible, 0.125)


def lanes_as_queries(q, kb, vb, r2t, req, seq, topk, steps, step):
    md = draft_lane_metadata(r2t, req, seq, topk, steps, step)
    return paged_sdpa(q, kb, vb, r2t, req, md.q_lens, md.kv_lens, md.visible, 0.125)


def seconds(fn, args, repeats: int) -> float:
    for _ in range(5):
        fn(*args)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--topk", type=int, default=4, help="draft lanes per request (make serve's W_max)")
    ap.add_argument("--steps", type=int, default=4, help="draft steps (make serve's max_depth)")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    pool = 64 * 1024
    kb = torch.randn(pool, KV_HEADS, HEAD_DIM, generator=g)
    vb = torch.randn(pool, KV_HEADS, HEAD_DIM, generator=g)
    print(f"topk {args.topk}, {args.steps} steps, one draft layer's attention, median of {args.repeats}")
    print("| requests | prefix | one row per lane ms | lanes as queries ms | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for bs, prefix in SHAPES:
        width = prefix + args.topk * args.steps
        r2t = torch.randperm(pool, generator=g)[: bs * width].view(bs, width).to(torch.int32)
        req = torch.randperm(bs, generator=g)
        seq = torch.randint(prefix // 2, prefix + 1, (bs,), generator=g)
        q = torch.randn(bs * args.topk, HEADS, HEAD_DIM, generator=g)
        call = (q, kb, vb, r2t, req, seq, args.topk, args.steps, 1)
        torch.testing.assert_close(lanes_as_queries(*call), one_row_per_lane(*call), rtol=1e-5, atol=1e-6)
        rows, lanes = (1e3 * seconds(fn, call, args.repeats) for fn in (one_row_per_lane, lanes_as_queries))
        print(f"| {bs} | {prefix} | {rows:.3f} | {lanes:.3f} | {rows / lanes:.2f}x |")


if __name__ == "__main__":
    main()
