"""RMSNorm and fused residual-add + RMSNorm as one Triton kernel (the fallback of `norms.py`).

Semantics are sgl_kernel's (FlashInfer's `RMSNorm` / `FusedAddRMSNorm`), computed in fp32 per row::

    rmsnorm:            out = x * rsqrt(mean(x^2) + eps) * w
    fused_add_rmsnorm:  s = x + r;  r <- s (cast);  x <- s * rsqrt(mean(s^2) + eps) * w

with ``s`` kept in fp32 for the norm (not re-read from the rounded residual), and the products
taken in that order before the one cast to the output dtype.

One program per row, two passes over it in ``BLOCK``-wide chunks: the first sums squares, the
second normalises and stores. A program reads every element of its row before writing it, so
the in-place forms (``out`` is ``x``; ``r`` rewritten) are safe. Any hidden size, any float dtype,
rows at any stride (the last dimension contiguous); nothing is allocated and no host sync
happens, so a launch can be captured in a CUDA graph. Runs on CPU tensors under
``TRITON_INTERPRET=1`` (set before this module is imported).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

MAX_BLOCK = 4096


@triton.jit
def _row_sum(x_row, r_row, cols, mask, HAS_RESIDUAL: tl.constexpr):
    """One chunk of ``x`` (plus the residual) of a row, in fp32; 0 where masked."""
    s = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        s += tl.load(r_row + cols, mask=mask, other=0.0).to(tl.float32)
    return s


@triton.jit
def _rmsnorm_rows(
    x_ptr,
    x_stride,
    r_ptr,
    r_stride,
    w_ptr,
    out_ptr,
    out_stride,
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_stride
    r_row = r_ptr + row * r_stride
    out_row = out_ptr + row * out_stride

    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, hidden, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        s = _row_sum(x_row, r_row, cols, cols < hidden, HAS_RESIDUAL)
        acc += s * s
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / hidden + eps)

    for start in range(0, hidden, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < hidden
        s = _row_sum(x_row, r_row, cols, mask, HAS_RESIDUAL)
        if HAS_RESIDUAL:
            tl.store(r_row + cols, s.to(r_ptr.dtype.element_ty), mask=mask)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_row + cols, (s * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def rmsnorm_rows(
    x: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    eps: float,
    residual: Optional[torch.Tensor] = None,
) -> None:
    """Normalise the rows of 2-D ``x`` into ``out`` (which may be ``x``); with ``residual``, first
    add it to ``x`` and store the sum back into it. Mutates ``out`` (and ``residual``) in place."""
    rows, hidden = x.shape
    if rows == 0:
        return
    for name, t in (("input", x), ("out", out), ("residual", residual)):
        if t is not None and (t.shape != x.shape or t.stride(-1) != 1):
            raise ValueError(
                f"rmsnorm: {name} must be [{rows}, {hidden}] with a contiguous last dim, "
                f"got shape {tuple(t.shape)} strides {t.stride()}"
            )
    if weight.shape != (hidden,) or weight.stride(-1) != 1:
        raise ValueError(f"rmsnorm: weight must be contiguous [{hidden}], got {tuple(weight.shape)}")
    block = min(triton.next_power_of_2(hidden), MAX_BLOCK)
    res = residual if residual is not None else x
    _rmsnorm_rows[(rows,)](
        x,
        x.stride(0),
        res,
        res.stride(0),
        weight,
        out,
        out.stride(0),
        hidden,
        float(eps),
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        num_warps=max(1, min(8, block // 256)),
    )
