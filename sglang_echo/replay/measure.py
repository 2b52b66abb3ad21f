"""``echo-replay measure-cost``: time the target's verify pass and the drafter's forwards here.

Verify: the repo's :class:`~sglang_echo.eval.HFTarget` runs ``verify`` (one forward over ``B``
chains of ``w`` tokens, ``K = B * w``, with the tree mask and feature capture of a real step)
on top of a KV prefix of ``prefix`` tokens per request. The prefix is prefilled once for one
request and replicated ``B`` times (its values do not change the cost), and the verify columns
are dropped after each timing so every repetition sees the same cache; the KV commit (a whole-
cache gather in this offline engine, a paged write in a server) is not timed.

Draft (EAGLE-3): :class:`~sglang_echo.drafters.eagle3.Eagle3Drafter` with the real head, caught
up on ``prefix`` random-feature pairs per request; a forward is the depth-1 ``propose`` over a
``[B, F]`` frontier (``B * F`` rows), and the catch-up of ``m`` committed tokens per request.

Each point is the median of ``reps`` timings after two warm-ups of its own shape (the first calls
of a new shape pay allocator and kernel-selection costs). The JSON records the machine (CPU
model, threads, load average before and after: other jobs may share the box) with every curve.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from sglang_echo.core.policy import Frontier
from sglang_echo.core.tree import DETERMINISTIC, DraftTrees

from ..bench.machine import describe as machine
from .cost import SCHEMA, VERSION


def _median_time(fn: Callable[[], None], reps: int, sync: Callable[[], None], warmup: int = 2) -> float:
    for _ in range(warmup):  # new shapes: allocator and kernel-selection warm-up
        fn()
    sync()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def chains(B: int, w: int, vocab: int, device) -> DraftTrees:
    """``B`` chains of ``w`` nodes (root included): ``K = B * w`` verified tokens."""
    g = torch.Generator().manual_seed(B * 1000 + w)
    N = B * w
    local = torch.arange(w).repeat(B)
    z = torch.zeros(N, device=device)
    return DraftTrees(
        indptr=(torch.arange(B + 1) * w).to(device),
        tokens=torch.randint(0, vocab, (N,), generator=g).to(device),
        parents=(local - 1).to(device),
        depth=local.to(device),
        logprob=z,
        path_score=z,
        drafter=torch.zeros(N, dtype=torch.int64, device=device),
        proposal=torch.full((N,), DETERMINISTIC, dtype=torch.int64, device=device),
    )


@torch.inference_mode()
def measure_verify(
    target, batches: Sequence[int], per_request: Sequence[int], prefix: int, max_tokens: int, reps: int, progress=None
) -> list[dict]:
    dev, V = target.device, target.config.vocab_size
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    target.prefill([torch.randint(0, V, (prefix,), generator=g)])
    one = [(layer.keys, layer.values) for layer in target._cache_layers()]
    points = []
    for B in batches:
        for layer, (k, v) in zip(target._cache_layers(), one):  # the prefix, replicated B times
            layer.keys, layer.values = k.expand(B, -1, -1, -1).contiguous(), v.expand(B, -1, -1, -1).contiguous()
        target.lens = torch.full((B,), prefix, dtype=torch.int64, device=dev)
        kv = [(layer.keys, layer.values) for layer in target._cache_layers()]
        for w in per_request:
            if B * w > max_tokens:
                continue
            trees = chains(B, w, V, dev)

            def run():
                target.verify(trees)
                # Drop the verify columns (HF appends a new tensor, the old one is intact).
                for layer, (k, v) in zip(target._cache_layers(), kv):
                    layer.keys, layer.values = k, v
                target._pending = None

            points.append({"batch": B, "tokens": B * w, "per_request": w, "seconds": _median_time(run, reps, sync)})
            if progress:
                progress(points[-1])
    return points


@torch.inference_mode()
def measure_eagle3(
    drafter,
    feature_dim: int,
    vocab: int,
    batches: Sequence[int],
    frontiers: Sequence[int],
    catch_up_tokens: Sequence[int],
    prefix: int,
    max_rows: int,
    reps: int,
    progress=None,
) -> dict:
    dev = drafter.device
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(1)
    fwd, cu = [], []
    for B in batches:
        prompts = [torch.randint(0, vocab, (prefix,), generator=g).to(dev) for _ in range(B)]
        drafter.start(prompts)
        drafter.catch_up(
            [p[1:].clone() for p in prompts] if prefix > 1 else [p for p in prompts],
            [torch.randn(max(prefix - 1, 1), feature_dim, generator=g).to(dev, drafter.dtype) for _ in range(B)],
        )
        empty = [torch.zeros(0, dtype=torch.int64, device=dev)] * B
        for F in frontiers:
            if B * F > max_rows:
                continue
            roots = Frontier(
                0,
                torch.zeros(B, 1, dtype=torch.int64, device=dev),
                torch.full((B, 1), -1, device=dev),
                prompts[0][:1].expand(B, 1).clone(),
                torch.zeros(B, 1, device=dev),
                torch.ones(B, dtype=torch.bool, device=dev),
            )

            def run() -> float:
                drafter.catch_up(empty, None)  # resets the step (nothing committed)
                c = drafter.propose(roots, F)  # depth 0: no forward, the catch-up's logits
                fr = Frontier(
                    1,
                    torch.arange(1, F + 1, device=dev).expand(B, F).contiguous(),
                    torch.arange(F, device=dev).expand(B, F).contiguous(),
                    c.tokens[:, :F].contiguous(),
                    c.logprob[:, :F].contiguous(),
                    roots.active,
                )
                sync()
                t0 = time.perf_counter()
                drafter.propose(fr, 1)  # one head forward over B * F rows: what we price
                sync()
                return time.perf_counter() - t0

            run(), run()  # warm-up
            ts = [run() for _ in range(reps)]
            fwd.append({"batch": B, "frontier": F, "rows": B * F, "seconds": statistics.median(ts)})
            if progress:
                progress(fwd[-1])
        for m in catch_up_tokens:
            toks = [torch.randint(0, vocab, (m,), generator=g).to(dev) for _ in range(B)]
            feats = [torch.randn(m, feature_dim, generator=g).to(dev, drafter.dtype) for _ in range(B)]
            cu.append(
                {
                    "batch": B,
                    "tokens_per_request": m,
                    "rows": B * m,
                    "seconds": _median_time(lambda: drafter.catch_up(toks, feats), reps, sync),
                }
            )
            if progress:
                progress(cu[-1])
    return {"forward": fwd, "catch_up": cu}


def measure(
    target_dir: Path,
    *,
    drafter: str,
    draft: Optional[Path],
    batches: Sequence[int],
    per_request: Sequence[int],
    frontiers: Sequence[int],
    catch_up_tokens: Sequence[int],
    prefix: int,
    max_tokens: int,
    max_rows: int,
    reps: int,
    device: str,
    label: str,
    command: str,
    progress=None,
) -> dict:
    from transformers import AutoModelForCausalLM

    from sglang_echo.bench.acceptance import build_drafter
    from sglang_echo.eval import HFTarget

    dev = torch.device(device)
    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).to(dev)
    d, captured = build_drafter(drafter, draft, model, dev)
    target = HFTarget(model, captured)
    out = {
        "schema": SCHEMA,
        "version": VERSION,
        "label": label,
        "command": command,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": machine(),
        "target": {
            "path": str(target_dir),
            "dtype": "float32",
            "prefix_len": prefix,
            "captured_layers": list(captured),
        },
        "verify": measure_verify(target, batches, per_request, prefix, max_tokens, reps, progress),
        "draft": None,
    }
    if drafter == "eagle3":
        out["draft"] = {
            "kind": "eagle3",
            "head": str(draft),
            **measure_eagle3(
                d,
                target.feature_dim,
                target.config.vocab_size,
                batches,
                frontiers,
                catch_up_tokens,
                prefix,
                max_rows,
                reps,
                progress,
            ),
        }
    out["machine"]["load_average_after"] = list(os.getloadavg())
    return out
