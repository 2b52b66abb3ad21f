"""Verify-attention benchmark (``python -m sglang_echo.kernels.bench``). GPU only.

Default mode: for batches 8..256 of ragged trees drawn from real ECHO allocations
(``make_policy("echo")`` on the synthetic world, ``k_max = batch * --tokens-per-req``) over
random prefixes, times tree-verify attention with our Triton kernel, FlashInfer (if importable),
FlexAttention (block mask) and SDPA (dense padded mask), prints each as a ratio to Triton plus
Triton's achieved bandwidth (compulsory bytes: Q, O and every prefix / tree K/V once).
FlexAttention and SDPA get their K/V pre-gathered into contiguous tensors outside the timed
region (they cannot read a slot-indexed cache), which favours them.

The verify-cost curve of a whole target (for trace replay) is :mod:`.verify_cost`.

Without CUDA it prints why and exits 0: no figure is ever estimated or faked.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from sglang_echo.core import PolicyConfig, build_trees, make_policy, pack
from sglang_echo.core.synthetic import SyntheticDrafter, SyntheticWorld

from .tree_attention.metadata import VerifyLayout, ragged_rows, unpack_bits


@dataclass
class VerifyBatch(VerifyLayout):
    """One verify step in the kernel contract (see :mod:`.tree_attention.metadata`) with its data."""

    q: Tensor
    k_cache: Tensor
    v_cache: Tensor
    sm_scale: float

    def args(self) -> tuple:
        return (
            self.q,
            self.k_cache,
            self.v_cache,
            self.qo_indptr,
            self.kv_indptr,
            self.kv_indices,
            self.tree_slots,
            self.packed_mask,
            self.sm_scale,
        )

    @property
    def num_prefix(self) -> int:
        return self.kv_indices.numel()


def echo_trees(batch: int, k_total: int, seed: int = 0, vocab: int = 1000):
    """Trees the ECHO scheduler allocates for ``batch`` requests under a ``k_total`` cap."""
    world = SyntheticWorld(batch, vocab=vocab, seed=seed)
    roots = torch.randint(0, vocab, (batch,), generator=torch.Generator().manual_seed(seed))
    policy = make_policy("echo", PolicyConfig(k_max=max(k_total, batch)))
    trees, _ = build_trees(policy, SyntheticDrafter(world), roots)
    return trees


def make_verify_batch(
    batch: int,
    k_total: int,
    prefix_range: tuple[int, int],
    hq: int,
    hkv: int,
    d: int,
    dtype: torch.dtype,
    device: str,
    seed: int = 0,
) -> VerifyBatch:
    """ECHO trees + random prefixes over a shuffled slot cache (prefix and tree slots interleaved)."""
    trees = echo_trees(batch, k_total, seed)
    g = torch.Generator().manual_seed(seed + 1)
    prefix = torch.randint(prefix_range[0], prefix_range[1] + 1, (batch,), generator=g)
    packed = pack(trees, prefix)
    n, p = trees.num_nodes, int(prefix.sum())
    slots = (torch.randperm(p + n, generator=g) + 1).to(torch.int32)  # slot 0 stays a spare
    kv_indptr = torch.zeros(batch + 1, dtype=torch.int32)
    kv_indptr[1:] = prefix.cumsum(0)
    s = p + n + 1

    def rnd(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    return VerifyBatch(
        q=rnd(n, hq, d),
        k_cache=rnd(s, hkv, d),
        v_cache=rnd(s, hkv, d),
        qo_indptr=packed.qo_indptr.to(device=device, dtype=torch.int32),
        kv_indptr=kv_indptr.to(device),
        kv_indices=slots[:p].to(device),
        tree_slots=slots[p:].to(device),
        packed_mask=packed.packed_mask.to(device),
        positions=packed.positions.to(device),
        sm_scale=d**-0.5,
    )


# ---- FlexAttention and SDPA baselines ---------------------------------------------------------
def flex_setup(vb: VerifyBatch) -> Callable[[], Tensor]:
    """Flat keys = [all prefixes | all tree tokens]; the block mask keeps each request separate."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    n, hq, d = vb.q.shape
    p = vb.num_prefix
    dev = vb.q.device
    q_req, _ = ragged_rows(vb.qo_indptr, n)
    p_req, _ = ragged_rows(vb.kv_indptr, p)
    t_req, t_loc = ragged_rows(vb.qo_indptr, n)
    key_req = torch.cat([p_req, t_req])
    key_loc = torch.cat([torch.full((p,), -1, device=dev, dtype=torch.int64), t_loc])
    words = vb.packed_mask

    def mask_mod(bb, h, qi, ki):
        loc = key_loc[ki]
        safe = loc.clamp(min=0)
        bit = (words[qi, safe // 32] >> (safe % 32)) & 1
        return (q_req[qi] == key_req[ki]) & ((loc < 0) | (bit == 1))

    slots = torch.cat([vb.kv_indices, vb.tree_slots]).long()
    k = vb.k_cache[slots].transpose(0, 1).unsqueeze(0).contiguous()  # [1, Hkv, L, D]
    v = vb.v_cache[slots].transpose(0, 1).unsqueeze(0).contiguous()
    q = vb.q.transpose(0, 1).unsqueeze(0).contiguous()
    block_mask = create_block_mask(mask_mod, 1, None, n, p + n, device=str(dev))
    fn = torch.compile(flex_attention) if dev.type == "cuda" else flex_attention
    return lambda: fn(q, k, v, block_mask=block_mask, scale=vb.sm_scale, enable_gqa=hq != k.shape[1])[0].transpose(0, 1)


def sdpa_setup(vb: VerifyBatch) -> Callable[[], Tensor]:
    """Requests padded to [B, W] queries and [B, Pmax + W] keys with a dense bool mask."""
    n, hq, d = vb.q.shape
    dev = vb.q.device
    qo_lens = (vb.qo_indptr[1:] - vb.qo_indptr[:-1]).long()
    kv_lens = (vb.kv_indptr[1:] - vb.kv_indptr[:-1]).long()
    b, w, pm = qo_lens.numel(), int(qo_lens.max()), int(kv_lens.max())
    req, loc = ragged_rows(vb.qo_indptr, n)
    pcol = torch.arange(pm, device=dev)
    pvalid = pcol[None] < kv_lens[:, None]
    pslots = vb.kv_indices[(vb.kv_indptr[:-1].long()[:, None] + pcol).clamp(max=max(vb.num_prefix - 1, 0))]
    tcol = torch.arange(w, device=dev)
    tvalid = tcol[None] < qo_lens[:, None]
    tslots = vb.tree_slots[(vb.qo_indptr[:-1].long()[:, None] + tcol).clamp(max=n - 1)]
    slots = torch.cat([torch.where(pvalid, pslots.long(), 0), torch.where(tvalid, tslots.long(), 0)], 1)
    k = vb.k_cache[slots].transpose(1, 2).contiguous()  # [B, Hkv, L, D]
    v = vb.v_cache[slots].transpose(1, 2).contiguous()
    qp = vb.q.new_zeros(b, w, hq, d)
    qp[req, loc] = vb.q
    qp = qp.transpose(1, 2).contiguous()
    tree = torch.zeros(b, w, w, dtype=torch.bool, device=dev)
    tree[req, loc] = unpack_bits(vb.packed_mask, w)
    mask = torch.cat([pvalid[:, None].expand(b, w, pm), tree & tvalid[:, None]], -1)
    mask[:, :, 0] |= ~mask.any(-1)  # padded query rows: keep them finite, they are dropped
    mask = mask[:, None]

    def run() -> Tensor:
        o = torch.nn.functional.scaled_dot_product_attention(
            qp, k, v, attn_mask=mask, scale=vb.sm_scale, enable_gqa=hq != k.shape[1]
        )
        return o.transpose(1, 2)[req, loc]

    return run


# ---- timing ---------------------------------------------------------------------------------
def cuda_time_ms(fn: Callable[[], object], warmup: int = 5, iters: int = 20) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def bench_attention(args: argparse.Namespace) -> None:
    from .tree_attention import flashinfer_path
    from .tree_attention.triton_kernel import bytes_moved, make_plan, tree_attention_triton

    dtype = getattr(torch, args.dtype)
    hq, hkv, d = args.heads, args.kv_heads, args.head_dim
    cols = ["batch", "N", "prefix", "triton_ms", "GB/s", "flashinfer/tri", "flex/tri", "sdpa/tri"]
    print(
        f"verify attention, {args.dtype}, Hq={hq} Hkv={hkv} D={d}, prefix {args.prefix_min}..{args.prefix_max}, "
        f"ECHO trees (k_max = {args.tokens_per_req} x batch), device {torch.cuda.get_device_name()}"
    )
    print(" ".join(f"{c:>14}" for c in cols))
    for batch in args.batches:
        vb = make_verify_batch(
            batch,
            batch * args.tokens_per_req,
            (args.prefix_min, args.prefix_max),
            hq,
            hkv,
            d,
            dtype,
            "cuda",
            seed=batch,
        )
        n = vb.q.shape[0]
        plan = make_plan(vb.qo_indptr, n, hkv, hq // hkv, d, max_prefix_len=args.prefix_max)
        tri = cuda_time_ms(lambda: tree_attention_triton(*vb.args(), plan=plan), iters=args.iters)
        gbs = bytes_moved(vb.q, vb.k_cache, vb.num_prefix) / tri / 1e6
        ratios = []
        if flashinfer_path.AVAILABLE:
            wrapper = flashinfer_path.make_wrapper("cuda")
            flashinfer_path.plan_flashinfer(wrapper, vb.q, vb.k_cache, *vb.args()[3:])
            fi = cuda_time_ms(
                lambda: flashinfer_path.run_flashinfer(wrapper, vb.q, vb.k_cache, vb.v_cache), iters=args.iters
            )
            ratios.append(f"{fi / tri:.2f}")
        else:
            ratios.append("n/a")
        for setup in (flex_setup, sdpa_setup):
            try:
                fn = setup(vb)
                ratios.append(f"{cuda_time_ms(fn, iters=args.iters) / tri:.2f}")
            except (RuntimeError, torch.OutOfMemoryError) as e:  # e.g. SDPA's dense mask at B=256
                ratios.append("failed")
                print(f"  {setup.__name__} at batch {batch}: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
        row = [batch, n, vb.num_prefix, f"{tri:.3f}", f"{gbs:.0f}", *ratios]
        print(" ".join(f"{str(c):>14}" for c in row))


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(prog="python -m sglang_echo.kernels.bench", description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=ints, default=[8, 16, 32, 64, 128, 256])
    p.add_argument("--tokens-per-req", type=int, default=8, help="ECHO k_max = this x batch")
    p.add_argument("--prefix-min", type=int, default=256)
    p.add_argument("--prefix-max", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--iters", type=int, default=20)
    return p.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "sglang_echo.kernels.bench: CUDA is not available on this machine; the benchmark only "
            "measures GPU kernels, so nothing was run (no figures are estimated)."
        )
        return 0
    bench_attention(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
