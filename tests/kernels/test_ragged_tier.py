"""Ragged tree-verify metadata per token tier (kernels/tree_attention/ragged_tier.py, graph_buffers.load_tier).

A compact verify forward holds the ``N = sum K_i`` real tree nodes then ``T - N`` padding lanes.
The metadata a CUDA graph's static views get for tier ``T`` must equal the eager metadata (``T = N``)
on the real rows, the attention over the tier must equal the naive dense-mask oracle there, and
every padding lane must output exactly 0. Runs the Triton kernel under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import pytest
import torch

from sglang_echo.core.pack import pad_trees
from sglang_echo.kernels.tree_attention.graph_buffers import TreeVerifyGraphBuffers
from sglang_echo.kernels.tree_attention.metadata import full_mask_cells
from sglang_echo.kernels.tree_attention.ragged_tier import (
    lane_map,
    packed_tree_rows,
    padding_requests,
    tier_indptrs,
    tier_metadata,
)
from sglang_echo.kernels.tree_attention.triton_kernel import tree_attention_triton

from .cases import Case, make_case, naive_attention

HQ, HKV, D, BLOCK_M, PAD_CHUNK = 4, 2, 16, 8, 8


def test_lane_map_packs_the_real_slots_request_major_then_pads():
    lens = torch.tensor([3, 1, 2])
    assert lane_map(lens, 4, 6).tolist() == [0, 1, 2, 4, 8, 9]  # N == T
    assert lane_map(lens, 4, 9).tolist() == [0, 1, 2, 4, 8, 9, -1, -1, -1]  # N < T
    assert lane_map(torch.tensor([2, 0, 1]), 3, 4).tolist() == [0, 1, 6, -1]  # an empty request takes no lane
    assert lane_map(torch.tensor([2, 1]), 2, 3).tolist() == [0, 1, 2]  # W_s = 2: the step's own width
    assert lane_map(torch.zeros(0, dtype=torch.int32), 5, 4).tolist() == [-1] * 4  # a capture: no request


def test_tier_indptrs_give_slots_then_padding_requests():
    lens = torch.tensor([3, 1], dtype=torch.int32)
    slots, tier = 4, 20  # 2 real requests in 4 slots; 16 padding lanes in chunks of 8 (3 padding requests)
    r = slots + padding_requests(tier, PAD_CHUNK)
    assert padding_requests(tier, PAD_CHUNK) == 3
    qo, kv = torch.zeros(r + 1, dtype=torch.int32), torch.zeros(r + 1, dtype=torch.int32)
    kv[: slots + 1] = torch.tensor([0, 5, 9, 10, 11])  # the padded slots hold sglang's fill length 1
    tier_indptrs(lens, slots, tier, PAD_CHUNK, qo, kv)
    assert qo.tolist() == [0, 3, 4, 4, 4, 12, 20, 20]  # real, empty slots, padding requests up to the tier
    assert kv.tolist() == [0, 5, 9, 10, 11, 11, 11, 11]  # padding requests read no prefix
    with pytest.raises(ValueError, match="request slots"):
        tier_indptrs(torch.ones(5, dtype=torch.int32), slots, tier, PAD_CHUNK, qo, kv)


def test_both_sglang_mask_layouts_give_the_same_packed_rows():
    g = torch.Generator().manual_seed(0)
    b, w = 3, 5
    tree = torch.rand(b, w, w, generator=g) < 0.5
    prefix = torch.tensor([4, 1, 7])
    full = torch.ones(int((w * (prefix + w)).sum()), dtype=torch.uint8)
    full[full_mask_cells(prefix, w).flatten()] = tree.flatten().to(torch.uint8)
    qlen = packed_tree_rows(tree.flatten(), prefix, w)
    assert torch.equal(packed_tree_rows(full, prefix, w), qlen)
    assert torch.equal(packed_tree_rows(tree.flatten().to(torch.uint8), prefix, w), qlen)


# -- a verify step in ECHO's dense layout -----------------------------------------------------------------
def _step(seed: int, width_slack: int = 2, empty: int = 0) -> tuple[Case, torch.Tensor, torch.Tensor, int]:
    """A random step: the kernel case, K, the requests' packed dense tree rows (W wide), W."""
    case = make_case(seed, 4, 9, 30, HQ, HKV, D, min_prefix=1, empty_requests=empty)
    lens = case.trees.sizes.to(torch.int32)
    width = int(lens.max()) + width_slack
    prefix = torch.tensor(case.prefix_lens)
    dense = pad_trees(case.trees, prefix, width).mask  # [B, W, W]; real nodes in slots [0, K_b)
    return case, lens, packed_tree_rows(dense.flatten(), prefix, width), width


def _eager(case: Case, lens, rows, width):
    n, b = case.q.shape[0], lens.numel()
    kv = torch.zeros(b + padding_requests(n, PAD_CHUNK) + 1, dtype=torch.int32)
    kv[: b + 1] = case.kv_indptr
    return tier_metadata(lens, width, n, b, rows, kv, case.kv_indices, block_m=BLOCK_M, pad_chunk=PAD_CHUNK)


def _buffers(width: int, top: int = 64) -> TreeVerifyGraphBuffers:
    return TreeVerifyGraphBuffers(
        max_batch=8,
        max_width=width,
        kv_capacity=0,
        num_heads=HQ,
        head_dim=D,
        device="cpu",
        buckets=(top,),
        block_m=BLOCK_M,
        pad_chunk=PAD_CHUNK,
    )


def _graph(bufs, case: Case, lens, rows, width, tier: int, slots: int):
    """What the backend does before a replay: sglang's prefix offsets for the slots (padded ones
    hold one token), then the tier's metadata into the static views."""
    b = lens.numel()
    view = bufs.view(tier, slots)
    view.kv_indptr[: b + 1] = case.kv_indptr
    view.kv_indptr[b + 1 : slots + 1] = case.kv_indptr[-1] + torch.arange(1, slots - b + 1)
    return bufs.load_tier(tier, slots, lens, width, rows, case.kv_indices)


@pytest.mark.parametrize("seed,extra,slots_extra,empty", [(0, 0, 0, 0), (1, 5, 3, 0), (2, 19, 1, 1), (3, 0, 4, 0)])
def test_tier_metadata_equals_the_eager_one_on_the_real_rows(seed, extra, slots_extra, empty):
    """N == T and N < T (padding lanes past a pad chunk), request slots past B, an empty request."""
    case, lens, rows, width = _step(seed, empty=empty)
    n, b = case.q.shape[0], lens.numel()
    eager = _eager(case, lens, rows, width)
    assert torch.equal(eager.packed_mask, case.packed_mask)  # the contract's rows, from ECHO's dense mask
    assert eager.qo_indptr[: b + 1].tolist() == case.qo_indptr.tolist() and int(eager.qo_indptr[-1]) == n
    tier, slots = n + extra, b + slots_extra
    graph = _graph(_buffers(width), case, lens, rows, width, tier, slots)
    assert graph.qo_indptr[: b + 1].tolist() == eager.qo_indptr[: b + 1].tolist()
    assert graph.kv_indptr[: b + 1].tolist() == eager.kv_indptr[: b + 1].tolist()
    assert torch.equal(graph.packed_mask[:n], eager.packed_mask)
    assert not graph.packed_mask[n:].any() and int(graph.qo_indptr[-1]) == tier
    assert graph.qo_indptr.numel() == slots + padding_requests(tier, PAD_CHUNK) + 1
    assert graph.lanes[:n].tolist() == eager.lanes.tolist() and (graph.lanes[n:] == -1).all()


@pytest.mark.parametrize("seed,extra", [(4, 0), (5, 7), (6, 26)])
def test_attention_over_a_tier_is_the_oracle_on_real_rows_and_zero_on_padding(seed, extra):
    case, lens, rows, width = _step(seed)
    n, b = case.q.shape[0], lens.numel()
    tier = n + extra
    graph = _graph(_buffers(width), case, lens, rows, width, tier, b + 2)
    q = torch.randn(tier, HQ, D) * 3  # padding lanes hold garbage queries on purpose
    q[:n] = case.q
    slots = torch.zeros(tier, dtype=torch.int32)  # padding lanes write (and would read) the sink, slot 0
    slots[:n] = case.tree_slots
    out = tree_attention_triton(
        q,
        case.k_cache,
        case.v_cache,
        graph.qo_indptr,
        graph.kv_indptr,
        graph.kv_indices,
        slots,
        graph.packed_mask,
        case.sm_scale,
        plan=graph.plan,
    )
    eager = _eager(case, lens, rows, width)
    want = tree_attention_triton(
        case.q,
        case.k_cache,
        case.v_cache,
        eager.qo_indptr,
        eager.kv_indptr,
        eager.kv_indices,
        case.tree_slots,
        eager.packed_mask,
        case.sm_scale,
        plan=eager.plan,
    )
    assert torch.isfinite(out).all() and (out[n:] == 0).all()
    torch.testing.assert_close(out[:n].double(), naive_attention(case), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[:n], want, atol=1e-6, rtol=1e-6)


def test_a_capture_and_every_replay_use_the_same_storage():
    """At capture no request is real (every lane pads, output 0); replays of any mix refill the
    same views, which is all a captured graph can read."""
    case, lens, rows, width = _step(7)
    n = case.q.shape[0]
    bufs, tier, slots = _buffers(width), n + 3, lens.numel() + 1
    kv_indices = torch.zeros(64, dtype=torch.int32)
    view = bufs.view(tier, slots)
    view.kv_indptr[: slots + 1] = torch.arange(slots + 1)  # sglang's fill: one token per slot
    capture = bufs.load_tier(tier, slots, torch.zeros(0, dtype=torch.int32), width, None, kv_indices)
    assert capture.qo_indptr[: slots + 1].eq(0).all() and not capture.packed_mask.any()
    out = tree_attention_triton(
        torch.randn(tier, HQ, D),
        case.k_cache,
        case.v_cache,
        capture.qo_indptr,
        capture.kv_indptr,
        capture.kv_indices,
        torch.zeros(tier, dtype=torch.int32),
        capture.packed_mask,
        0.25,
        plan=capture.plan,
    )
    assert (out == 0).all()
    replay = _graph(bufs, case, lens, rows, width, tier, slots)
    for a, b in (
        (capture.qo_indptr, replay.qo_indptr),
        (capture.kv_indptr, replay.kv_indptr),
        (capture.packed_mask, replay.packed_mask),
        (capture.plan.block_req, replay.plan.block_req),
    ):
        assert a.data_ptr() == b.data_ptr() and a.shape == b.shape


def test_tier_limits_are_checked():
    bufs = _buffers(5, top=32)
    with pytest.raises(ValueError, match="largest bucket"):
        bufs.view(40, 2)
    with pytest.raises(ValueError, match="max_batch"):
        bufs.view(16, 9)
    with pytest.raises(ValueError, match="wide"):
        bufs.load_tier(16, 2, torch.ones(2, dtype=torch.int32), 40, None, torch.zeros(1, dtype=torch.int32))
