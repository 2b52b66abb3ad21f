"""Bucket padding of the static graph buffers must not change real outputs (and gives no NaN)."""

from __future__ import annotations

import pytest
import torch

from sglang_echo.kernels.tree_attention import tree_attention_reference
from sglang_echo.kernels.tree_attention.graph_buffers import (
    DEFAULT_TOKEN_BUCKETS,
    TreeVerifyGraphBuffers,
    padding_cost,
)
from sglang_echo.kernels.tree_attention.triton_kernel import tree_attention_triton

from .cases import make_case


def _buffers(hq: int, d: int, splits: int = 1) -> TreeVerifyGraphBuffers:
    return TreeVerifyGraphBuffers(
        max_batch=6,
        max_width=40,
        kv_capacity=256,
        num_heads=hq,
        head_dim=d,
        device="cpu",
        buckets=(8, 16, 32, 64),
        block_m=8,
        pad_chunk=8,
        num_splits={32: splits, 64: splits},
    )


@pytest.mark.parametrize("seed,splits", [(0, 1), (1, 3)])
def test_padding_does_not_change_outputs(seed, splits):
    case = make_case(seed, 4, 9, 30, 4, 2, 16, min_prefix=1, empty_requests=1)
    bufs = _buffers(4, 16, splits)
    n = case.q.shape[0]
    view = bufs.load(case.qo_indptr, case.kv_indptr, case.kv_indices, case.tree_slots, case.packed_mask, case.positions)
    assert view.bucket == bufs.bucket_for(n) and view.bucket >= n
    q = torch.randn(view.bucket, 4, 16)  # padding rows hold garbage queries on purpose
    q[:n] = case.q
    want = tree_attention_triton(*case.args())
    out = tree_attention_triton(
        q, case.k_cache, case.v_cache, *view.args(), case.sm_scale, plan=view.plan, workspace=view.workspace
    )
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[:n], want, atol=1e-6, rtol=1e-6)
    assert (out[n:] == 0).all()
    ref = tree_attention_reference(q, case.k_cache, case.v_cache, *view.args(), case.sm_scale)
    torch.testing.assert_close(ref[:n], want, atol=1e-5, rtol=1e-5)
    assert torch.equal(view.positions[:n], case.positions) and (view.positions[n:] == 0).all()


def test_changing_mixes_reuse_the_same_views():
    bufs = _buffers(2, 16)
    views = []
    for seed in range(3):  # different tree mixes landing in buckets; the views stay fixed-shape
        case = make_case(10 + seed, 3, 6, 12, 2, 1, 16)
        v = bufs.load(
            case.qo_indptr, case.kv_indptr, case.kv_indices, case.tree_slots, case.packed_mask, case.positions
        )
        assert v.qo_indptr.numel() == bufs.requests_for(v.bucket) + 1
        assert int(v.qo_indptr[-1]) == v.bucket  # every row belongs to a request
        views.append((v.bucket, v.qo_indptr.data_ptr(), v.plan.block_req.data_ptr()))
    assert len({(qo, blk) for _, qo, blk in views}) == 1  # same storage every step


def test_limits_are_checked():
    bufs = _buffers(2, 16)
    with pytest.raises(ValueError):
        bufs.bucket_for(65)
    case = make_case(20, 7, 2, 3, 2, 1, 16)  # 7 requests > max_batch 6
    with pytest.raises(ValueError):
        bufs.load(case.qo_indptr, case.kv_indptr, case.kv_indices, case.tree_slots, case.packed_mask, case.positions)


def test_documented_padding_cost():
    worst, mean = padding_cost(DEFAULT_TOKEN_BUCKETS)
    assert worst < 0.5 and 0.15 < mean < 0.2  # numbers quoted in the module docstring
