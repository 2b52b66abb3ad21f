"""The benchmark exits cleanly without CUDA, and its baselines compute the same attention."""

from __future__ import annotations

import pytest
import torch

from sglang_echo.kernels import bench
from sglang_echo.kernels.tree_attention import tree_attention_reference


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_no_cuda_message_and_exit_zero(capsys):
    assert bench.main([]) == 0
    assert "CUDA is not available" in capsys.readouterr().out


def test_echo_batch_and_baselines_match_reference():
    vb = bench.make_verify_batch(4, 24, (1, 20), 4, 2, 16, torch.float32, "cpu", seed=3)
    assert vb.qo_indptr.numel() == 5 and int(vb.qo_indptr[-1]) == vb.q.shape[0]
    want = tree_attention_reference(*vb.args())
    torch.testing.assert_close(bench.sdpa_setup(vb)(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(bench.flex_setup(vb)(), want, atol=1e-5, rtol=1e-5)
