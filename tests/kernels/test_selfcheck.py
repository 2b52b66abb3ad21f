"""The fused control plane's start-up check (kernels/control/selfcheck.py): passes where the kernels
reproduce the eager steps, and names the first difference where they do not."""

from __future__ import annotations

import torch

from sglang_echo.core.factory import PolicyConfig
from sglang_echo.kernels.control import layout, selfcheck

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: under the interpreter (conftest)
CFG = PolicyConfig(k_max=64, max_depth=4, w_def=1, w_max=2)


def test_the_kernels_pass_their_start_up_check():
    assert selfcheck.first_difference("echo", CFG, DEVICE, batches=(1, 33)) is None


def test_a_kernel_that_lays_the_mask_out_wrongly_is_caught(monkeypatch):
    honest = layout.pad_pool

    def wrong(pool, prefix, width, out=None):
        padded = honest(pool, prefix, width)
        padded.mask[:, -1, 0] = ~padded.mask[:, -1, 0]  # one ancestor bit flipped per request
        return padded

    monkeypatch.setattr(layout, "pad_pool", wrong)
    problem = selfcheck.first_difference("echo", CFG, DEVICE, batches=(8,))
    assert problem == "echo at batch 8: pad_pool's mask differs from the eager layout"
