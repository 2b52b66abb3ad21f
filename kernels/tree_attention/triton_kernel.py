"""Triton tree-verify attention (same contract as :func:`.reference.tree_attention_reference`).

Work decomposition
------------------
* One program per (query block, KV head, prefix split). A query block is up to ``block_m``
  consecutive tree tokens of *one* request (see :func:`.metadata.build_block_table`), and the
  program handles all ``Hq / Hkv`` query heads that share the KV head: its Q tile has
  ``block_m * group`` rows, so every prefix K/V tile is loaded once for all of them. Tree
  verify is bandwidth-bound on the prefix; this sharing is the point of the kernel.
* Split-K: the prefix of each request is cut into ``num_splits`` tile-aligned chunks; the tree
  part (``K_i`` keys, visibility read from the bit-packed mask) is done by the last split. Each
  split writes a normalised partial output and its log2-sum-exp; :func:`_combine_kernel` merges
  them. With ``num_splits == 1`` the program writes the final output directly.
* Online softmax in fp32 (``exp2`` with ``sm_scale * log2(e)``); inputs bf16/fp16/fp32, fp32
  accumulators (fp32 dots use IEEE precision, not TF32). A row that sees no key outputs 0.
  Under the CPU interpreter the tiles are upcast to fp32 before ``tl.dot`` (its bf16 dot is
  broken in Triton 3.8); loads, stores and conversions still run in the input dtype.

Everything the launch needs is shapes, host constants and device tensors, so a call with a
precomputed :class:`.metadata.TreeAttentionPlan` (and optional workspace) is CUDA-graph safe.
Set ``TRITON_INTERPRET=1`` *before importing this module* to run it on CPU tensors (tests).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from .metadata import TreeAttentionPlan, build_block_table

LOG2E = 1.4426950408889634
MAX_SPLITS = 16


@triton.jit
def _online_update(s, v, m_i, l_i, acc, DOT_PRECISION: tl.constexpr):
    """One flash-attention step on a tile of log2-scaled scores ``s`` (masked entries -inf)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # Rows with nothing visible yet keep m = -inf; shift them by 0 so exp2 gives 0, not NaN.
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, out_dtype=tl.float32, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _kv_tile(K, V, slot, n_ok, kvh, offs_d, d_ok, stride_kn, stride_kh, stride_vn, stride_vh, DOT_FP32: tl.constexpr):
    """Gather one tile of keys ``[D, N]`` (transposed for the QK dot) and values ``[N, D]``."""
    k = tl.load(
        K + slot[None, :] * stride_kn + kvh * stride_kh + offs_d[:, None], mask=n_ok[None, :] & d_ok[:, None], other=0.0
    )
    v = tl.load(
        V + slot[:, None] * stride_vn + kvh * stride_vh + offs_d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0
    )
    if DOT_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v


@triton.jit
def _tree_attn_fwd(
    Q,
    K,
    V,
    O,
    PartO,
    PartLse,
    qo_indptr,
    kv_indptr,
    kv_indices,
    tree_slots,
    mask,
    block_req,
    block_start,
    scale_log2,
    stride_qn,
    stride_qh,
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    stride_on,
    stride_oh,
    stride_mn,
    stride_ps,
    stride_pn,
    stride_ph,
    stride_ls,
    stride_ln,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    req = tl.load(block_req + pid)
    if req < 0:  # unused entry of the fixed-size block table
        return
    q_start = tl.load(block_start + pid).to(tl.int64)
    q_lo = tl.load(qo_indptr + req).to(tl.int64)
    q_hi = tl.load(qo_indptr + req + 1).to(tl.int64)
    kv_lo = tl.load(kv_indptr + req).to(tl.int64)
    kv_hi = tl.load(kv_indptr + req + 1).to(tl.int64)

    ROWS: tl.constexpr = BLOCK_M * GROUP_PAD
    rows = tl.arange(0, ROWS)
    tok = q_start + rows // GROUP_PAD  # query token of each row
    g = rows % GROUP_PAD
    head = kvh * GROUP + g
    row_ok = (tok < q_hi) & (g < GROUP)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM

    q = tl.load(
        Q + tok[:, None] * stride_qn + head[:, None] * stride_qh + offs_d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    if DOT_FP32:
        q = q.to(tl.float32)
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)

    # ---- prefix: every row sees every key of its request's chunk for this split -----------
    plen = kv_hi - kv_lo
    chunk = tl.cdiv(tl.cdiv(plen, NUM_SPLITS), BLOCK_N) * BLOCK_N
    p_lo = split * chunk
    p_hi = tl.minimum(p_lo + chunk, plen)
    for n0 in range(p_lo, p_hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < p_hi
        slot = tl.load(kv_indices + kv_lo + offs_n, mask=n_ok, other=0).to(tl.int64)
        k, v = _kv_tile(K, V, slot, n_ok, kvh, offs_d, d_ok, stride_kn, stride_kh, stride_vn, stride_vh, DOT_FP32)
        s = tl.dot(q, k, out_dtype=tl.float32, input_precision=DOT_PRECISION) * scale_log2
        s = tl.where(row_ok[:, None] & n_ok[None, :], s, float("-inf"))
        m_i, l_i, acc = _online_update(s, v, m_i, l_i, acc, DOT_PRECISION)

    # ---- tree: ancestors-or-self from the bit-packed mask (last split only) ----------------
    if split == NUM_SPLITS - 1:
        # Nodes are topologically ordered, so no row of this block sees a node past its last row.
        t_hi = tl.minimum(q_hi - q_lo, q_start - q_lo + BLOCK_M)
        for n0 in range(0, t_hi, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            n_ok = offs_n < t_hi
            slot = tl.load(tree_slots + q_lo + offs_n, mask=n_ok, other=0).to(tl.int64)
            k, v = _kv_tile(K, V, slot, n_ok, kvh, offs_d, d_ok, stride_kn, stride_kh, stride_vn, stride_vh, DOT_FP32)
            s = tl.dot(q, k, out_dtype=tl.float32, input_precision=DOT_PRECISION) * scale_log2
            both = row_ok[:, None] & n_ok[None, :]
            word = tl.load(mask + tok[:, None] * stride_mn + (offs_n // 32)[None, :], mask=both, other=0)
            bit = (word >> (offs_n % 32)[None, :]) & 1  # arithmetic shift is fine: we keep 1 bit
            s = tl.where(both & (bit != 0), s, float("-inf"))
            m_i, l_i, acc = _online_update(s, v, m_i, l_i, acc, DOT_PRECISION)

    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    io_mask = row_ok[:, None] & d_ok[None, :]
    if NUM_SPLITS == 1:
        tl.store(
            O + tok[:, None] * stride_on + head[:, None] * stride_oh + offs_d[None, :],
            out.to(O.dtype.element_ty),
            mask=io_mask,
        )
    else:
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        tl.store(
            PartO + split * stride_ps + tok[:, None] * stride_pn + head[:, None] * stride_ph + offs_d[None, :],
            out,
            mask=io_mask,
        )
        tl.store(PartLse + split * stride_ls + tok * stride_ln + head, lse, mask=row_ok)


@triton.jit
def _combine_kernel(
    O,
    PartO,
    PartLse,
    stride_on,
    stride_oh,
    stride_ps,
    stride_pn,
    stride_ph,
    stride_ls,
    stride_ln,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    """Merge split partials of one (token, head): weights ``2^(lse_s - max lse)``."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    sp = tl.arange(0, SPLITS_PAD)
    s_ok = sp < NUM_SPLITS
    lse = tl.load(PartLse + sp * stride_ls + t * stride_ln + h, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m_use)  # 0 for empty splits
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    part = tl.load(
        PartO + sp[:, None] * stride_ps + t * stride_pn + h * stride_ph + offs_d[None, :],
        mask=s_ok[:, None] & d_ok[None, :] & (w[:, None] > 0),
        other=0.0,
    )
    total = tl.sum(w, 0)
    out = tl.sum(part * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(O + t * stride_on + h * stride_oh + offs_d, out.to(O.dtype.element_ty), mask=d_ok)


def default_blocks(group: int, head_dim: int, device: torch.device) -> tuple[int, int]:
    """(block_m tokens, block_n keys): ~64 Q rows per program (16 when interpreted, for speed)."""
    group_pad = triton.next_power_of_2(group)
    rows = 64 if device.type == "cuda" else 16
    block_m = max(1, rows // group_pad)
    block_n = 64 if head_dim <= 64 or device.type != "cuda" else 32
    return block_m, (block_n if device.type == "cuda" else 16)


def choose_num_splits(
    num_blocks: int, num_kv_heads: int, device: torch.device, max_prefix_len: Optional[int] = None
) -> int:
    """Split the prefix only when the (block, head) grid leaves SMs idle.

    ``max_prefix_len`` (a host value the caller may know, e.g. the scheduler's max context)
    keeps every split at >= 256 keys so short prefixes are not split for nothing.
    """
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    programs = max(1, num_blocks * num_kv_heads)
    splits = min(MAX_SPLITS, max(1, -(-2 * sms // programs)))
    if max_prefix_len is not None:
        splits = min(splits, max(1, max_prefix_len // 256))
    return splits


def make_plan(
    qo_indptr: Tensor,
    num_tokens: int,
    num_kv_heads: int,
    group: int,
    head_dim: int,
    num_splits: Optional[int] = None,
    block_m: Optional[int] = None,
    max_prefix_len: Optional[int] = None,
) -> TreeAttentionPlan:
    """Plan one step (block table + split factor); reuse it for every layer of the step."""
    bm = block_m or default_blocks(group, head_dim, qo_indptr.device)[0]
    req, start = build_block_table(qo_indptr, num_tokens, bm)
    if num_splits is None:
        num_splits = choose_num_splits(req.numel(), num_kv_heads, qo_indptr.device, max_prefix_len)
    return TreeAttentionPlan(req, start, bm, num_splits)


def workspace_for(
    num_splits: int, num_tokens: int, num_heads: int, head_dim: int, device: torch.device
) -> tuple[Tensor, Tensor]:
    """Split partials ``([S, N, Hq, D], [S, N, Hq])`` fp32 (preallocate them for graph capture)."""
    return (
        torch.empty(num_splits, num_tokens, num_heads, head_dim, dtype=torch.float32, device=device),
        torch.empty(num_splits, num_tokens, num_heads, dtype=torch.float32, device=device),
    )


def tree_attention_triton(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    qo_indptr: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    tree_slots: Tensor,
    packed_mask: Tensor,
    sm_scale: float,
    *,
    num_splits: Optional[int] = None,
    plan: Optional[TreeAttentionPlan] = None,
    out: Optional[Tensor] = None,
    workspace: Optional[tuple[Tensor, Tensor]] = None,
    block_m: Optional[int] = None,
    block_n: Optional[int] = None,
) -> Tensor:
    """Tree-verify attention with the reference's signature (plus tuning / graph arguments).

    ``plan`` (from :func:`make_plan`) overrides ``num_splits`` / ``block_m``; ``workspace``
    (from :func:`workspace_for`, at least ``[plan.num_splits, N, Hq, D]``) avoids allocation.
    ``qo_indptr[-1]`` must equal ``N``: every query row belongs to a request (pad with
    zero-mask requests, see :mod:`.graph_buffers`).
    """
    n, hq, d = q.shape
    hkv = k_cache.shape[1]
    if hq % hkv:
        raise ValueError(f"{hq} query heads are not a multiple of {hkv} KV heads")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache / v_cache need a contiguous head dim")
    group = hq // hkv
    q = q if q.stride(-1) == 1 else q.contiguous()
    if out is None:
        out = torch.empty_like(q)
    if n == 0:
        return out
    bm_default, bn_default = default_blocks(group, d, q.device)
    if plan is None:
        plan = make_plan(qo_indptr, n, hkv, group, d, num_splits, block_m or bm_default)
    bn = block_n or bn_default
    splits = plan.num_splits
    group_pad = triton.next_power_of_2(group)
    if q.is_cuda and (plan.block_m * group_pad < 16 or bn < 16):  # tl.dot needs >= 16 per dim
        raise ValueError(f"block_m * next_pow2(group) must be >= 16 (got {plan.block_m} x {group_pad}, block_n {bn})")
    block_d = max(16, triton.next_power_of_2(d))
    mask = packed_mask if packed_mask.stride(-1) == 1 else packed_mask.contiguous()
    if splits > 1:
        part_o, part_lse = workspace if workspace is not None else workspace_for(splits, n, hq, d, q.device)
    else:
        part_o, part_lse = out, out.new_empty(1, 1, 1, dtype=torch.float32)  # unused
    # Triton 3.8's CPU interpreter computes bf16 tl.dot wrongly (bit patterns read as integers),
    # so interpreted runs upcast tiles to fp32 before the dots; GPUs keep native bf16/fp16 dots.
    dot_fp32 = not q.is_cuda
    dot_precision = "ieee" if q.dtype == torch.float32 or dot_fp32 else "tf32"
    grid = (plan.capacity, hkv, splits)
    _tree_attn_fwd[grid](
        q,
        k_cache,
        v_cache,
        out,
        part_o,
        part_lse,
        qo_indptr,
        kv_indptr,
        kv_indices,
        tree_slots,
        mask,
        plan.block_req,
        plan.block_start,
        sm_scale * LOG2E,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        out.stride(0),
        out.stride(1),
        mask.stride(0),
        part_o.stride(0),
        part_o.stride(1),
        part_o.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        HEAD_DIM=d,
        GROUP=group,
        GROUP_PAD=group_pad,
        BLOCK_M=plan.block_m,
        BLOCK_N=bn,
        BLOCK_D=block_d,
        NUM_SPLITS=splits,
        DOT_PRECISION=dot_precision,
        DOT_FP32=dot_fp32,
        **({"num_warps": 4, "num_stages": 2} if q.is_cuda else {}),
    )
    if splits > 1:
        _combine_kernel[(n, hq)](
            out,
            part_o,
            part_lse,
            out.stride(0),
            out.stride(1),
            part_o.stride(0),
            part_o.stride(1),
            part_o.stride(2),
            part_lse.stride(0),
            part_lse.stride(1),
            HEAD_DIM=d,
            BLOCK_D=block_d,
            NUM_SPLITS=splits,
            SPLITS_PAD=triton.next_power_of_2(splits),
        )
    return out


def bytes_moved(q: Tensor, k_cache: Tensor, num_prefix_tokens: int) -> int:
    """Compulsory DRAM traffic of one call: Q, O, and each request's prefix + tree K/V once."""
    n, hq, d = q.shape
    hkv = k_cache.shape[1]
    kv = 2 * (num_prefix_tokens + n) * hkv * d * k_cache.element_size()
    return kv + 2 * n * hq * d * q.element_size()
