"""Platform tests: the CUDA mode's Triton kernel runs on CPU tensors under Triton's interpreter.

Triton reads ``TRITON_INTERPRET`` when a ``@triton.jit`` function is decorated and again at each
launch (see tests/kernels/conftest.py), so without CUDA the kernel module is imported here with
the variable set and the ``triton_interpret`` fixture sets it around each test that launches it.
"""

from __future__ import annotations

import os
from unittest import mock

import pytest
import torch

if not torch.cuda.is_available():
    with mock.patch.dict(os.environ, TRITON_INTERPRET="1"):
        import sglang_echo.platform.cuda.triton_norms  # noqa: F401


@pytest.fixture
def triton_interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
