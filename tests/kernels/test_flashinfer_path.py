"""FlashInfer path: the page-size-1 layout is checked on CPU; the real wrapper only with flashinfer."""

from __future__ import annotations

import pytest
import torch

from sglang_echo.kernels.tree_attention import flashinfer_path
from sglang_echo.kernels.tree_attention.flashinfer_path import flashinfer_layout

from .cases import make_case, naive_attention


def test_layout_reproduces_the_attention():
    case = make_case(0, 4, 10, 20, 4, 2, 16, empty_requests=1)
    indptr, indices, mask = flashinfer_layout(
        case.qo_indptr, case.kv_indptr, case.kv_indices, case.tree_slots, case.packed_mask
    )
    # Emulate FlashInfer: per request, keys = pages, mask rows K_i x (P_i + K_i) row-major.
    out = torch.zeros_like(case.q, dtype=torch.float64)
    g = case.q.shape[1] // case.k_cache.shape[1]
    m_off = 0
    for i in range(case.qo_indptr.numel() - 1):
        lo, hi = int(case.qo_indptr[i]), int(case.qo_indptr[i + 1])
        pages = indices[int(indptr[i]) : int(indptr[i + 1])].long()
        rows, cols = hi - lo, pages.numel()
        vis = mask[m_off : m_off + rows * cols].view(rows, cols)
        m_off += rows * cols
        if rows == 0:
            continue
        k = case.k_cache[pages].double().repeat_interleave(g, 1)
        v = case.v_cache[pages].double().repeat_interleave(g, 1)
        s = torch.einsum("nhd,lhd->hnl", case.q[lo:hi].double(), k) * case.sm_scale
        out[lo:hi] = torch.einsum("hnl,lhd->nhd", s.masked_fill(~vis, float("-inf")).softmax(-1), v)
    assert m_off == mask.numel()
    torch.testing.assert_close(out, naive_attention(case))


@pytest.mark.gpu
@pytest.mark.skipif(not (flashinfer_path.AVAILABLE and torch.cuda.is_available()), reason="needs flashinfer + CUDA")
def test_flashinfer_matches_reference():
    from sglang_echo.kernels.tree_attention import tree_attention_reference

    case = make_case(1, 16, 24, 600, 32, 8, 128, dtype=torch.bfloat16, device="cuda", min_prefix=1)
    out = flashinfer_path.tree_attention_flashinfer(*case.args())
    torch.testing.assert_close(out.float(), tree_attention_reference(*case.args()).float(), atol=2e-2, rtol=2e-2)
