"""GPU cost curves for trace replay (``python -m sglang_echo.kernels.verify_cost``). GPU only.

ECHO's premise (Sec. 2, Eq. 2) is the shape of ``T_verify(B, K)``: flat while the target pass is
memory-bound, then linear once the ``K`` verified tokens make it compute-bound. This module
measures that curve on the GPU it runs on for any Llama-shaped target given by its HF
``config.json`` (random bf16 weights: the values do not change the cost), and the curves of an
EAGLE-3 head of the matching shape, and writes them in the cost-file schema of
:mod:`sglang_echo.replay.cost`, so ``echo-replay run --cost FILE`` prices replayed ECHO steps
with GPU timings.

What one point times:

* verify ``(B, w)``: the whole target forward (embedding, every decoder layer with our Triton
  tree-attention kernel over a ``prefix``-token KV prefix per request plus its own chain of ``w``
  tokens, final norm, LM head over all ``K = B * w`` tokens) -- what sglang's TARGET_VERIFY pass
  runs, minus sampling and the KV commit;
* draft forward ``(B, F)``: one EAGLE-3 head forward over ``B * F`` frontier rows (``[embed;
  hidden]`` into the attention, the head's own KV prefix, draft-vocab LM head);
* draft catch-up ``(B, m)``: the head's ``fc`` over three captured target layers, then the same
  forward over ``m`` committed tokens per request.

Each point is replayed from a CUDA graph (sglang captures its decode / verify passes too, so
Python launch overhead is not part of the curve; eager timing is used, and recorded, only where
capture fails) and is the median of ``--iters`` event-timed replays after warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import Tensor

from .tree_attention.metadata import VerifyLayout

SCHEMA, VERSION = "sglang-echo/replay-cost", 1  # = sglang_echo.replay.cost (not imported: no heavy deps)


@dataclass(frozen=True)
class LlamaShape:
    """The shapes that set a Llama-family forward's cost."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    layers: int
    rope_theta: float = 10000.0

    @classmethod
    def from_hf(cls, cfg: dict) -> "LlamaShape":
        heads = cfg["num_attention_heads"]
        rope = cfg.get("rope_parameters") or {}
        return cls(
            hidden=cfg["hidden_size"],
            heads=heads,
            kv_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            inter=cfg["intermediate_size"],
            vocab=cfg["vocab_size"],
            layers=cfg["num_hidden_layers"],
            rope_theta=float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0))),
        )


class RaggedBatch(VerifyLayout):
    """``B`` requests of ``w`` query rows each over a ``prefix``-token KV prefix (kernel contract)."""

    @classmethod
    def build(cls, batch: int, width: int, prefix: int, chain: bool, device: str) -> "RaggedBatch":
        """Request ``b`` owns slots ``b * (prefix + width) + [0, prefix + width)``; slot order is
        what a page-size-1 allocator gives a request that was served alone. ``chain``: row ``l``
        sees rows ``0..l`` of its request (a verify chain); else only itself (draft frontier rows)."""
        if width > 32:
            raise ValueError("one mask word per row: width <= 32")
        b = torch.arange(batch, device=device)
        local = torch.arange(width, device=device)
        base = (b * (prefix + width))[:, None]
        bits = (2 ** (local + 1) - 1) if chain else 2**local
        return cls(
            qo_indptr=(torch.arange(batch + 1, device=device) * width).to(torch.int32),
            kv_indptr=(torch.arange(batch + 1, device=device) * prefix).to(torch.int32),
            kv_indices=(base + torch.arange(prefix, device=device)).flatten().to(torch.int32),
            tree_slots=(base + prefix + local).flatten().to(torch.int32),
            packed_mask=bits.repeat(batch).to(torch.int32)[:, None].contiguous(),
            positions=(prefix + (local if chain else torch.ones_like(local))).repeat(batch),
        )


class DecoderLayer(torch.nn.Module):
    """One Llama layer (GQA attention through the Triton tree kernel, SwiGLU MLP), random weights.

    ``in_features`` is the attention input width: ``hidden`` for a target layer, ``2 * hidden``
    for EAGLE-3's layer, which attends over ``[embed; hidden]``.
    """

    def __init__(self, s: LlamaShape, in_features: Optional[int] = None, dtype=torch.bfloat16, device="cuda"):
        super().__init__()
        kw = {"dtype": dtype, "device": device}
        self.s = s
        in_features = in_features or s.hidden
        self.norm1 = torch.nn.RMSNorm(in_features, **kw)
        self.qkv = torch.nn.Linear(in_features, (s.heads + 2 * s.kv_heads) * s.head_dim, bias=False, **kw)
        self.o = torch.nn.Linear(s.heads * s.head_dim, s.hidden, bias=False, **kw)
        self.norm2 = torch.nn.RMSNorm(s.hidden, **kw)
        self.gate_up = torch.nn.Linear(s.hidden, 2 * s.inter, bias=False, **kw)
        self.down = torch.nn.Linear(s.inter, s.hidden, bias=False, **kw)
        half = torch.arange(0, s.head_dim, 2, device=device, dtype=torch.float32) / s.head_dim
        self.register_buffer("inv_freq", 1.0 / s.rope_theta**half, persistent=False)

    def rope(self, x: Tensor, positions: Tensor) -> Tensor:
        f = positions.float()[:, None] * self.inv_freq[None]
        cos, sin = f.cos()[:, None].to(x.dtype), f.sin()[:, None].to(x.dtype)
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)

    def forward(self, x: Tensor, residual: Tensor, rb: RaggedBatch, kv: tuple[Tensor, Tensor], plan) -> Tensor:
        from .tree_attention.triton_kernel import tree_attention_triton

        s, n = self.s, x.shape[0]
        qkv = self.qkv(self.norm1(x)).view(n, s.heads + 2 * s.kv_heads, s.head_dim)
        q = self.rope(qkv[:, : s.heads], rb.positions)
        slots = rb.tree_slots.long()
        kv[0][slots] = self.rope(qkv[:, s.heads : s.heads + s.kv_heads], rb.positions)  # write, then attend
        kv[1][slots] = qkv[:, s.heads + s.kv_heads :]
        a = tree_attention_triton(
            q,
            kv[0],
            kv[1],
            rb.qo_indptr,
            rb.kv_indptr,
            rb.kv_indices,
            rb.tree_slots,
            rb.packed_mask,
            s.head_dim**-0.5,
            plan=plan,
        )
        h = residual + self.o(a.reshape(n, -1))
        gate, up = self.gate_up(self.norm2(h)).chunk(2, -1)
        return h + self.down(torch.nn.functional.silu(gate) * up)


class Target(torch.nn.Module):
    """A Llama-shaped target: embedding, ``layers`` decoder layers, norm, LM head."""

    def __init__(self, s: LlamaShape, device="cuda"):
        super().__init__()
        kw = {"dtype": torch.bfloat16, "device": device}
        self.s = s
        self.embed = torch.nn.Embedding(s.vocab, s.hidden, **kw)
        self.layers = torch.nn.ModuleList(DecoderLayer(s, device=device) for _ in range(s.layers))
        self.norm = torch.nn.RMSNorm(s.hidden, **kw)
        self.lm_head = torch.nn.Linear(s.hidden, s.vocab, bias=False, **kw)

    def forward(self, tokens: Tensor, rb: RaggedBatch, caches, plan) -> Tensor:
        h = self.embed(tokens)
        for layer, kv in zip(self.layers, caches):
            h = layer(h, h, rb, kv, plan)
        return self.lm_head(self.norm(h))


class Eagle3Head(torch.nn.Module):
    """An EAGLE-3 head's compute: ``fc`` (3 captured layers -> hidden), one layer over
    ``[embed; hidden]``, norm, draft-vocab LM head (shapes from the head's ``config.json``)."""

    def __init__(self, s: LlamaShape, draft_vocab: int, device="cuda"):
        super().__init__()
        kw = {"dtype": torch.bfloat16, "device": device}
        self.s = s
        self.embed = torch.nn.Embedding(s.vocab, s.hidden, **kw)
        self.fc = torch.nn.Linear(3 * s.hidden, s.hidden, bias=False, **kw)
        self.layer = DecoderLayer(s, in_features=2 * s.hidden, device=device)
        self.norm = torch.nn.RMSNorm(s.hidden, **kw)
        self.lm_head = torch.nn.Linear(s.hidden, draft_vocab, bias=False, **kw)

    def forward(self, tokens: Tensor, hidden: Tensor, rb: RaggedBatch, kv, plan, fused: bool) -> Tensor:
        h = self.fc(hidden) if fused else hidden  # catch-up reads 3 target layers; deeper steps its own output
        h = self.layer(torch.cat([self.embed(tokens), h], -1), h, rb, kv, plan)
        return self.lm_head(self.norm(h))


def median_ms(fn: Callable[[], object], warmup: int = 3, iters: int = 10) -> float:
    """Median of ``iters`` CUDA-event timings, each of one call, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def graphed(fn: Callable[[], object]) -> tuple[Callable[[], object], bool]:
    """``fn`` captured in a CUDA graph (replay), or ``fn`` itself if capture fails."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside the graph: Triton compiles, cuBLAS picks kernels
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay, True
    except RuntimeError as e:
        print(f"  CUDA graph capture failed ({str(e)[:100]}); timing eagerly", file=sys.stderr)
        torch.cuda.synchronize()
        return fn, False


@torch.inference_mode()
def time_forward(
    model_fn, s: LlamaShape, batch: int, width: int, prefix: int, chain: bool, iters: int
) -> tuple[float, bool]:
    from .tree_attention.triton_kernel import make_plan

    rb = RaggedBatch.build(batch, width, prefix, chain, "cuda")
    n = batch * width
    plan = make_plan(rb.qo_indptr, n, s.kv_heads, s.heads // s.kv_heads, s.head_dim, max_prefix_len=prefix)
    tokens = torch.randint(0, s.vocab, (n,), device="cuda")
    fn, is_graph = graphed(lambda: model_fn(tokens, rb, plan))
    return median_ms(fn, iters=iters), is_graph


def kv_caches(s: LlamaShape, layers: int, slots: int) -> list[tuple[Tensor, Tensor]]:
    """Random bf16 K/V slot caches (never zeros: they can time faster than real data)."""
    return [
        tuple(torch.randn(slots, s.kv_heads, s.head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        for _ in range(layers)
    ]


def measure(
    target_cfg: dict,
    draft_cfg: Optional[dict],
    batches: list[int],
    per_request: list[int],
    frontiers: list[int],
    catch_up_tokens: list[int],
    prefix: int,
    max_tokens: int,
    max_rows: int,
    iters: int,
    label: str,
    command: str,
) -> dict:
    s = LlamaShape.from_hf(target_cfg)
    torch.manual_seed(0)
    widest = max(per_request + frontiers + catch_up_tokens)
    slots = max(batches) * (prefix + widest)
    target = Target(s)
    caches = kv_caches(s, s.layers, slots)
    out = {
        "schema": SCHEMA,
        "version": VERSION,
        "label": label,
        "command": command,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "node": os.uname().nodename},
        "target": {"shape": asdict(s), "dtype": "bfloat16", "weights": "random", "prefix_len": prefix},
        "verify": [],
        "draft": None,
    }
    for B in batches:
        for w in per_request:
            if B * w > max_tokens:
                continue
            ms, g = time_forward(lambda t, rb, p: target(t, rb, caches, p), s, B, w, prefix, True, iters)
            out["verify"].append({"batch": B, "tokens": B * w, "per_request": w, "seconds": ms / 1e3, "cuda_graph": g})
            print(f"verify  B={B:4d} K={B * w:5d}: {ms:8.3f} ms{'' if g else ' (eager)'}", flush=True)
    target = caches = None  # free the target's weights and caches before the draft's
    torch.cuda.empty_cache()
    if draft_cfg is not None:
        ds = LlamaShape.from_hf({**draft_cfg, "num_hidden_layers": 1})
        head = Eagle3Head(ds, draft_cfg.get("draft_vocab_size", ds.vocab))
        kv = kv_caches(ds, 1, slots)[0]
        feats = torch.randn(max(batches) * widest, 3 * ds.hidden, device="cuda", dtype=torch.bfloat16)
        hid = feats[:, : ds.hidden].contiguous()
        fwd, cu = [], []
        for B in batches:
            for F in frontiers:
                if B * F <= max_rows:
                    ms, g = time_forward(
                        lambda t, rb, p: head(t, hid[: t.numel()], rb, kv, p, False), ds, B, F, prefix, False, iters
                    )
                    fwd.append({"batch": B, "frontier": F, "rows": B * F, "seconds": ms / 1e3, "cuda_graph": g})
                    print(f"draft   B={B:4d} rows={B * F:5d}: {ms:8.3f} ms", flush=True)
            for m in catch_up_tokens:
                ms, g = time_forward(
                    lambda t, rb, p: head(t, feats[: t.numel()], rb, kv, p, True), ds, B, m, prefix, True, iters
                )
                cu.append({"batch": B, "tokens_per_request": m, "rows": B * m, "seconds": ms / 1e3, "cuda_graph": g})
                print(f"catchup B={B:4d} rows={B * m:5d}: {ms:8.3f} ms", flush=True)
        out["draft"] = {
            "kind": "eagle3",
            "head": {"shape": asdict(ds), "draft_vocab": head.lm_head.out_features, "weights": "random"},
            "forward": fwd,
            "catch_up": cu,
        }
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ints = lambda v: [int(x) for x in v.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(prog="python -m sglang_echo.kernels.verify_cost", description=__doc__.splitlines()[0])
    p.add_argument("--target-config", type=Path, required=True, help="HF config.json of a Llama-shaped target")
    p.add_argument("--draft-config", type=Path, default=None, help="an EAGLE-3 head's config.json (draft curves)")
    p.add_argument("--batches", type=ints, default=[1, 8, 16, 32, 64, 128, 256])
    p.add_argument("--tokens-per-request", type=ints, default=[1, 2, 4, 8, 16], help="verify K = B * this")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--frontiers", type=ints, default=[1, 4, 10, 16], help="draft rows = B * this")
    p.add_argument("--max-rows", type=int, default=4096)
    p.add_argument("--catch-up-tokens", type=ints, default=[1, 2, 4])
    p.add_argument("--prefix", type=int, default=512, help="KV prefix per request")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--label", default="gpu")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "sglang_echo.kernels.verify_cost: CUDA is not available here; nothing was measured (no figure is "
            "ever estimated)."
        )
        return 0
    out = measure(
        json.loads(args.target_config.read_text()),
        json.loads(args.draft_config.read_text()) if args.draft_config else None,
        args.batches,
        args.tokens_per_request,
        args.frontiers,
        args.catch_up_tokens,
        args.prefix,
        args.max_tokens,
        args.max_rows,
        args.iters,
        args.label,
        "python -m sglang_echo.kernels.verify_cost " + " ".join(argv if argv is not None else sys.argv[1:]),
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}: {len(out['verify'])} verify points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
