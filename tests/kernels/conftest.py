"""Kernel tests: make Triton interpretable on CPU.

* Triton 3.8 reads ``TRITON_INTERPRET`` when a ``@triton.jit`` function is *decorated*
  (``triton.runtime.jit.jit`` checks ``knobs.runtime.interpret``, a live getenv), so importing
  our kernel module here with the variable set is enough: no subprocess needed. Launches also
  read it (Triton imports its gluon package lazily and asserts interpret mode), so an autouse
  fixture sets it during each kernel test; between them it is restored, so Triton code imported
  by other test folders (sglang's) is unaffected.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    _previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import sglang_echo.kernels.control.elastic  # noqa: F401
        import sglang_echo.kernels.control.layout  # noqa: F401
        import sglang_echo.kernels.tree_attention.triton_kernel as _triton_kernel
    finally:
        if _previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = _previous
    from triton.runtime.interpreter import InterpretedFunction

    assert isinstance(_triton_kernel._tree_attn_fwd, InterpretedFunction), (
        "the Triton kernel module was imported before TRITON_INTERPRET was set"
    )
    import triton.language.standard as _tl_standard

    assert isinstance(_tl_standard.zeros, InterpretedFunction), (
        "triton.language was imported before tests/kernels set TRITON_INTERPRET (a test module "
        "collected earlier imports sglang at module level); import sglang inside those tests instead"
    )


@pytest.fixture(autouse=True)
def _triton_interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
