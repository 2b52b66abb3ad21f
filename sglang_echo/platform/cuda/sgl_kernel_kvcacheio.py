"""`sgl_kernel.kvcacheio` on CUDA: only stubs raising NotImplementedError (see missing.py)."""

from sglang_echo.platform.cuda import missing

globals().update(missing.stubs("sgl_kernel.kvcacheio"))
__sglang_echo_shim__ = "cuda"
