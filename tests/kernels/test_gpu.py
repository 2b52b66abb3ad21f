"""GPU checks at real sizes: Triton vs reference, dtypes, splits, and CUDA-graph capture/replay."""

from __future__ import annotations

import pytest
import torch

from sglang_echo.kernels.tree_attention import tree_attention_reference

from .cases import make_case

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("dtype,atol", [(torch.bfloat16, 2e-2), (torch.float16, 4e-3), (torch.float32, 1e-4)])
@pytest.mark.parametrize("hq,hkv,d", [(32, 8, 128), (32, 32, 64), (28, 4, 128)])
@pytest.mark.parametrize("splits", [None, 1, 4])
def test_triton_real_sizes(dtype, atol, hq, hkv, d, splits):
    from sglang_echo.kernels.tree_attention.triton_kernel import tree_attention_triton

    case = make_case(0, 32, 48, 3000, hq, hkv, d, dtype=dtype, device="cuda", min_prefix=1, empty_requests=2, width=64)
    out = tree_attention_triton(*case.args(), num_splits=splits)
    want = tree_attention_reference(*case.args())
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), want.float(), atol=atol, rtol=atol)


def test_graph_capture_replay_with_changing_mixes():
    from sglang_echo.kernels.tree_attention.graph_buffers import TreeVerifyGraphBuffers
    from sglang_echo.kernels.tree_attention.triton_kernel import tree_attention_triton

    hq, hkv, d = 32, 8, 128
    bufs = TreeVerifyGraphBuffers(
        max_batch=16,
        max_width=64,
        kv_capacity=16 * 2048,
        num_heads=hq,
        head_dim=d,
        device="cuda",
        buckets=(64, 128, 256, 512),
        block_m=16,
        num_splits={64: 4, 128: 2},
    )
    slots = 16 * 2048 + 512 + 8
    k_cache = torch.randn(slots, hkv, d, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    q_buf = torch.zeros(512, hq, d, device="cuda", dtype=torch.bfloat16)
    graphs, outs = {}, {}
    for bucket in bufs.buckets:  # capture once per bucket on the static views
        view = bufs.view(bucket)
        view.qo_indptr.zero_()  # an all-empty batch is a valid capture input
        view.plan.block_req.fill_(-1)
        fn = (
            lambda v=view, b=bucket: tree_attention_triton(  # noqa: E731
                q_buf[:b], k_cache, v_cache, *v.args(), d**-0.5, plan=v.plan, workspace=v.workspace
            )
        )
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs[bucket] = fn()
        graphs[bucket] = g
    for seed, (batch, width) in enumerate([(3, 40), (16, 30), (8, 64), (1, 1), (12, 10)]):
        case = make_case(
            seed, batch, width, 2000, hq, hkv, d, dtype=torch.bfloat16, device="cuda", min_prefix=1, width=64
        )
        case.k_cache, case.v_cache = k_cache, v_cache  # case slots fit inside the shared cache
        n = case.q.shape[0]
        view = bufs.load(
            case.qo_indptr, case.kv_indptr, case.kv_indices, case.tree_slots, case.packed_mask, case.positions
        )
        q_buf[:n] = case.q
        q_buf[n:] = 0
        graphs[view.bucket].replay()
        out = outs[view.bucket]
        want = tree_attention_reference(*case.args())
        assert torch.isfinite(out).all() and (out[n : view.bucket] == 0).all()
        torch.testing.assert_close(out[:n].float(), want.float(), atol=2e-2, rtol=2e-2)


def test_ragged_tier_graphs_capture_without_requests_and_replay_any_mix():
    """echo_tree_triton's ragged graphs: each tier captured with no real request (every lane pads),
    then replayed after load_tier refilled the same views with a step's mix (sglang's prep)."""
    from sglang_echo.core.pack import pad_trees
    from sglang_echo.kernels.tree_attention.graph_buffers import TreeVerifyGraphBuffers
    from sglang_echo.kernels.tree_attention.ragged_tier import packed_tree_rows
    from sglang_echo.kernels.tree_attention.triton_kernel import tree_attention_triton

    hq, hkv, d, width, slots = 32, 8, 128, 24, 16
    tiers = (64, 112, 224)
    bufs = TreeVerifyGraphBuffers(
        max_batch=slots,
        max_width=width,
        kv_capacity=0,
        num_heads=hq,
        head_dim=d,
        device="cuda",
        buckets=(tiers[-1],),
        block_m=16,
    )
    cache = 16 * 2048 + 512 + 8
    k_cache = torch.randn(cache, hkv, d, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    kv_indices = torch.zeros(16 * 2048, dtype=torch.int32, device="cuda")
    q_buf = torch.zeros(tiers[-1], hq, d, device="cuda", dtype=torch.bfloat16)
    tree_slots = torch.zeros(tiers[-1], dtype=torch.int32, device="cuda")
    none = torch.zeros(0, dtype=torch.int32, device="cuda")
    graphs, outs = {}, {}
    for tier in tiers:
        bufs.view(tier, slots).kv_indptr[: slots + 1] = torch.arange(slots + 1, device="cuda")
        md = bufs.load_tier(tier, slots, none, width, None, kv_indices)
        fn = (
            lambda m=md, t=tier: tree_attention_triton(  # noqa: E731
                q_buf[:t],
                k_cache,
                v_cache,
                m.qo_indptr,
                m.kv_indptr,
                m.kv_indices,
                tree_slots[:t],
                m.packed_mask,
                d**-0.5,
                plan=m.plan,
            )
        )
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs[tier] = fn()
        graphs[tier] = g
    for seed, batch in enumerate([3, 16, 8, 1, 12]):
        case = make_case(seed, batch, 12, 2000, hq, hkv, d, dtype=torch.bfloat16, device="cuda", min_prefix=1)
        case.k_cache, case.v_cache = k_cache, v_cache
        n, b = case.q.shape[0], case.trees.batch_size
        tier = min(t for t in tiers if t >= n)
        prefix = torch.tensor(case.prefix_lens, device="cuda")
        rows = packed_tree_rows(pad_trees(case.trees, prefix, width).mask.flatten(), prefix, width)
        view = bufs.view(tier, slots)
        view.kv_indptr[: b + 1] = case.kv_indptr
        view.kv_indptr[b + 1 : slots + 1] = case.kv_indptr[-1]
        kv_indices[: case.kv_indices.numel()] = case.kv_indices
        bufs.load_tier(tier, slots, case.trees.sizes.to(torch.int32), width, rows, kv_indices)
        q_buf.zero_()
        q_buf[:n] = case.q
        tree_slots.zero_()
        tree_slots[:n] = case.tree_slots
        graphs[tier].replay()
        out = outs[tier]
        assert torch.isfinite(out).all() and (out[n:] == 0).all()
        torch.testing.assert_close(
            out[:n].float(), tree_attention_reference(*case.args()).float(), atol=2e-2, rtol=2e-2
        )
