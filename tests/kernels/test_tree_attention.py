"""Reference and Triton (interpreted on CPU) tree-verify attention against a naive dense oracle."""

from __future__ import annotations

import pytest
import torch

from sglang_echo.kernels.tree_attention import tree_attention_reference
from sglang_echo.kernels.tree_attention.triton_kernel import tree_attention_triton

from .cases import make_case, naive_attention

# (seed, batch, max_nodes, max_prefix, min_prefix, hq, hkv, d, empty_requests, width)
CASES = [
    (0, 3, 9, 30, 1, 4, 4, 16, 0, None),  # MHA, prefixes >= 1 token
    (1, 4, 12, 40, 0, 4, 2, 16, 1, None),  # GQA 2, empty prefixes and an empty request
    (2, 2, 1, 5, 1, 8, 2, 16, 0, None),  # root-only trees, 1..5-token prefixes, GQA 4
    (3, 2, 40, 20, 1, 6, 2, 24, 0, 40),  # GQA 3 (non power of two), 2 mask words, D=24
    (4, 3, 6, 1, 1, 2, 1, 16, 2, None),  # 1-token prefixes, GQA 2, two empty requests
]
IDS = ["mha", "gqa2-empty", "roots-gqa4", "gqa3-2words", "prefix1"]


def _check(out: torch.Tensor, case, atol: float) -> None:
    want = naive_attention(case)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double().cpu(), want, atol=atol, rtol=atol)


@pytest.mark.parametrize("params", CASES, ids=IDS)
def test_reference_matches_naive(params):
    seed, b, k, p, pmin, hq, hkv, d, empty, width = params
    case = make_case(seed, b, k, p, hq, hkv, d, min_prefix=pmin, empty_requests=empty, width=width)
    _check(tree_attention_reference(*case.args()), case, 1e-5)


@pytest.mark.parametrize("splits", [1, 2, 5])
@pytest.mark.parametrize("params", CASES, ids=IDS)
def test_triton_matches_naive(params, splits):
    seed, b, k, p, pmin, hq, hkv, d, empty, width = params
    case = make_case(seed, b, k, p, hq, hkv, d, min_prefix=pmin, empty_requests=empty, width=width)
    _check(tree_attention_triton(*case.args(), num_splits=splits), case, 1e-5)


def test_triton_several_query_blocks_per_request():
    # block_m=2 tokens: one request spans many blocks, and the tree loop stops at each block's end.
    case = make_case(5, 2, 20, 24, 2, 1, 16)
    _check(tree_attention_triton(*case.args(), num_splits=2, block_m=2, block_n=16), case, 1e-5)


@pytest.mark.parametrize("dtype,atol", [(torch.float16, 3e-3), (torch.bfloat16, 2e-2)])
def test_half_precision(dtype, atol):
    case = make_case(6, 3, 10, 30, 4, 2, 16, dtype=dtype, min_prefix=1)
    out = tree_attention_triton(*case.args(), num_splits=2)
    assert out.dtype == dtype
    _check(out, case, atol)
    _check(tree_attention_reference(*case.args()), case, atol)


def test_rows_that_see_nothing_output_zero():
    case = make_case(7, 2, 6, 0, 2, 2, 16)  # no prefix at all
    case.packed_mask[1] = 0  # token 1 sees no key
    for fn in (tree_attention_reference, tree_attention_triton):
        out = fn(*case.args())
        assert torch.isfinite(out).all() and (out[1] == 0).all()


def test_empty_batch():
    case = make_case(8, 1, 1, 3, 2, 2, 16)
    q = case.q[:0]
    args = (
        q,
        case.k_cache,
        case.v_cache,
        torch.zeros(1, dtype=torch.int32),
        torch.zeros(1, dtype=torch.int32),
        case.kv_indices[:0],
        case.tree_slots[:0],
        case.packed_mask[:0],
        case.sm_scale,
    )
    assert tree_attention_reference(*args).shape == (0, 2, 16)
    assert tree_attention_triton(*args).shape == (0, 2, 16)
