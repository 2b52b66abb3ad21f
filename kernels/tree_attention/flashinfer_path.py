"""Tree-verify attention through FlashInfer's ``BatchPrefillWithPagedKVCacheWrapper``.

Same contract as :func:`.reference.tree_attention_reference`. The slot cache is a paged cache
with page size 1 (``[S, 1, Hkv, D]``, NHD): request ``i``'s page list is its prefix slots then
its tree slots, and FlashInfer's custom mask (``K_i x (P_i + K_i)`` per request, row-major, the
prefix columns all True) is expanded from the bit-packed tree mask. FlashInfer needs host-side
planning, so :func:`plan_flashinfer` syncs; plan once per step and reuse the wrapper for every
layer. Importing this module never requires flashinfer (``AVAILABLE`` says whether it is there).
"""

from __future__ import annotations

import importlib.util
from typing import Any, Optional

import torch
from torch import Tensor

from .metadata import ragged_rows, unpack_bits

AVAILABLE: bool = importlib.util.find_spec("flashinfer") is not None


def _flashinfer() -> Any:
    if not AVAILABLE:
        raise RuntimeError("flashinfer is not installed; use the Triton path")
    import flashinfer

    return flashinfer


def flashinfer_layout(
    qo_indptr: Tensor, kv_indptr: Tensor, kv_indices: Tensor, tree_slots: Tensor, packed_mask: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """(paged_kv_indptr, paged_kv_indices, flat bool custom mask) for page size 1.

    Vectorised; reads two host sizes (total keys and total mask cells), which plan() needs anyway.
    """
    dev = qo_indptr.device
    qo_lens = (qo_indptr[1:] - qo_indptr[:-1]).to(torch.int64)
    kv_lens = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int64)
    lens = kv_lens + qo_lens
    paged_indptr = torch.zeros_like(qo_indptr, dtype=torch.int32)
    paged_indptr[1:] = lens.cumsum(0)
    total_keys, n = int(paged_indptr[-1]), tree_slots.numel()
    req, col = ragged_rows(paged_indptr, total_keys)
    is_prefix = col < kv_lens[req]
    prefix_src = (kv_indptr.to(torch.int64)[req] + col).clamp(max=max(kv_indices.numel() - 1, 0))
    tree_src = (qo_indptr.to(torch.int64)[req] + col - kv_lens[req]).clamp(0, max(n - 1, 0))
    indices = torch.where(
        is_prefix, kv_indices[prefix_src].long() if kv_indices.numel() else 0, tree_slots[tree_src].long()
    ).to(torch.int32)

    # Mask rows: token t of request r has lens[r] columns: P_r ones then its tree bits.
    tok_req, _ = ragged_rows(qo_indptr, n)
    row_len = lens[tok_req]
    mask_indptr = torch.zeros(n + 1, dtype=torch.int64, device=dev)
    mask_indptr[1:] = row_len.cumsum(0)
    cells = int(mask_indptr[-1])
    row, c = ragged_rows(mask_indptr, cells)
    p = kv_lens[tok_req][row]
    width = int(qo_lens.max()) if qo_lens.numel() else 0
    bits = unpack_bits(packed_mask, max(width, 1))
    tree_col = (c - p).clamp(0, max(width - 1, 0))
    mask = torch.where(c < p, torch.ones_like(c, dtype=torch.bool), bits[row, tree_col])
    return paged_indptr, indices, mask


def plan_flashinfer(
    wrapper: Any,
    q: Tensor,
    k_cache: Tensor,
    qo_indptr: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    tree_slots: Tensor,
    packed_mask: Tensor,
    sm_scale: float,
) -> None:
    """Plan ``wrapper`` (a ``BatchPrefillWithPagedKVCacheWrapper``) for one verify step."""
    paged_indptr, indices, mask = flashinfer_layout(qo_indptr, kv_indptr, kv_indices, tree_slots, packed_mask)
    b = qo_indptr.numel() - 1
    wrapper.plan(
        qo_indptr=qo_indptr.to(torch.int32),
        paged_kv_indptr=paged_indptr,
        paged_kv_indices=indices,
        paged_kv_last_page_len=torch.ones(b, dtype=torch.int32, device=q.device),
        num_qo_heads=q.shape[1],
        num_kv_heads=k_cache.shape[1],
        head_dim_qk=q.shape[2],
        page_size=1,
        custom_mask=mask,
        sm_scale=sm_scale,
        q_data_type=q.dtype,
        kv_data_type=k_cache.dtype,
    )


def make_wrapper(device: torch.device | str, workspace_bytes: int = 256 << 20) -> Any:
    fi = _flashinfer()
    ws = torch.empty(workspace_bytes, dtype=torch.uint8, device=device)
    return fi.BatchPrefillWithPagedKVCacheWrapper(ws, kv_layout="NHD")


def run_flashinfer(wrapper: Any, q: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
    """Run a planned wrapper on one layer's caches (page size 1: ``[S, 1, Hkv, D]``)."""
    return wrapper.run(q, (k_cache.unsqueeze(1), v_cache.unsqueeze(1)))


def tree_attention_flashinfer(
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
    wrapper: Optional[Any] = None,
) -> Tensor:
    """One-shot plan + run with the reference's signature (tests and benchmarks)."""
    wrapper = wrapper if wrapper is not None else make_wrapper(q.device)
    plan_flashinfer(wrapper, q, k_cache, qo_indptr, kv_indptr, kv_indices, tree_slots, packed_mask, sm_scale)
    return run_flashinfer(wrapper, q, k_cache, v_cache)
