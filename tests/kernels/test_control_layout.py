"""The layout kernels (:mod:`sglang_echo.kernels.control.layout`) over pool sizes and widths on
both sides of every warp and tile boundary, into poisoned buffers: ``pad_pool`` and
``dense_from_padded`` equal their torch twins cell for cell, and write every cell. On the CPU
under ``TRITON_INTERPRET=1`` (conftest); on a GPU (``-m gpu``) compiled, eagerly and replayed as
CUDA graphs. ``test_control.py`` compiles them for sm_90 and checks their layout conversions."""

from __future__ import annotations

import itertools

import pytest
import torch

from sglang_echo.core.dense import DenseVerifyTensors, dense_from_padded
from sglang_echo.core.pack import PaddedTrees, pad_pool
from sglang_echo.kernels.control import layout

from .control_cases import assert_same_fields, dense_buffers, padded_buffers, poison_, random_pool

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
POOLS = (1, 2, 31, 32, 33, 40, 63, 64, 65, 127, 129)  # around 32 lanes, 64-slot tiles, two warps' rows
WIDTHS = (1, 2, 13, 14, 16, 17, 19, 32, 33)  # one warp up to 16, two up to 32, four beyond
SHAPES = list(itertools.product(POOLS, WIDTHS))


def prefix_for(batch: int, seed: int, device=DEVICE) -> torch.Tensor:
    return torch.randint(1, 500, (batch,), generator=torch.Generator().manual_seed(seed)).to(device)


def check_layout(pool, prefix, width) -> None:
    B = pool.batch_size
    ref = pad_pool(pool, prefix, width)
    out = layout.pad_pool(pool, prefix, width, out=padded_buffers(B, width, prefix.device))
    assert_same_fields(out, ref, PaddedTrees)
    dense = layout.dense_from_padded(ref, prefix, out=dense_buffers(B, width, prefix.device))
    assert_same_fields(dense, dense_from_padded(ref, prefix), DenseVerifyTensors)


@pytest.mark.parametrize("pool_size, width", SHAPES)
def test_layout_kernels_equal_torch_at_every_size(pool_size, width):
    """Random trees (truncated where the width is smaller than the kept slots), three requests."""
    for seed in range(2 if DEVICE == "cuda" else 1):  # the interpreter is slow: one pool per shape on the CPU
        check_layout(random_pool(3, pool_size, 1000 * pool_size + width + seed, DEVICE), prefix_for(3, seed), width)


def test_default_buffers_are_the_same_layout():
    """Without ``out`` the kernels allocate their own buffers, with the same results."""
    pool, prefix = random_pool(4, 40, 7, DEVICE), prefix_for(4, 7)
    ref = pad_pool(pool, prefix, 14)
    out = layout.pad_pool(pool, prefix, 14)
    assert_same_fields(out, ref, PaddedTrees)
    assert_same_fields(layout.dense_from_padded(out, prefix), dense_from_padded(ref, prefix), DenseVerifyTensors)


def test_a_pool_with_only_its_roots_lays_out_as_roots():
    pool = random_pool(5, 33, 3, DEVICE)
    pool.keep[:, 1:] = False
    out = layout.pad_pool(pool, prefix_for(5, 3), 13, out=padded_buffers(5, 13, DEVICE))
    assert out.valid[:, 0].all() and not out.valid[:, 1:].any()
    assert out.mask.sum().item() == 5 and (out.parents == -1).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("pool_size, width", [(33, 13), (40, 14), (40, 19), (129, 27), (65, 33), (2, 1)])
def test_layout_kernels_replayed_as_cuda_graphs(pool_size, width):
    """Both kernels captured once on static, poisoned buffers; every replay with a new pool."""
    B = 64
    static = random_pool(B, pool_size, 0, "cuda")
    prefix = prefix_for(B, 0, "cuda")
    padded, dense = padded_buffers(B, width, "cuda"), dense_buffers(B, width, "cuda")

    def run():
        layout.dense_from_padded(layout.pad_pool(static, prefix, width, out=padded), prefix, out=dense)

    run()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for seed in range(1, 4):
        fresh = random_pool(B, pool_size, seed, "cuda")
        for f in ("tokens", "parent", "depth", "valid", "keep"):
            getattr(static, f).copy_(getattr(fresh, f))
        prefix.copy_(prefix_for(B, seed, "cuda"))
        for buf in (padded, dense):  # what the replay leaves unwritten stays poisoned
            for t in vars(buf).values():
                poison_(t)
        graph.replay()
        torch.cuda.synchronize()
        ref = pad_pool(fresh, prefix, width)
        assert_same_fields(padded, ref, PaddedTrees)
        assert_same_fields(dense, dense_from_padded(ref, prefix), DenseVerifyTensors)
