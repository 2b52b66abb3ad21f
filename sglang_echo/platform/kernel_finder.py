"""Provide an `sgl_kernel` module where the real sglang-kernel is missing: on the CPU engine, or on CUDA.

Why a meta-path finder: sglang does `from sgl_kernel import ...` at MODULE IMPORT time (e.g.
sglang/srt/layers/layernorm.py on CUDA, sglang/kernels/ops/kvcache/cache_move.py on the CPU
engine), and in the scheduler subprocess that import happens while unpickling the process target,
before `sglang.srt.plugins.load_plugins()` runs there. So no sglang plugin hook is early enough;
the finder is installed by the one-line `sglang_echo_platform.pth` (see install.py) at interpreter
start, and again (idempotently) by our general plugin in the launching process.

Which module it provides is decided by :func:`platform_mode`, only when `sgl_kernel` itself is
being imported (the one place torch is consulted):

* a real sglang-kernel is importable: nothing. The finder is APPENDED to `sys.meta_path`, so the
  normal path finder finds the real package first and this one is never consulted;
* `SGLANG_USE_CPU_ENGINE=1`: the CPU shim (`sgl_kernel_shim.py`, pure-torch `*_cpu` ops);
* torch sees a CUDA device (not ROCm): the CUDA shim (`cuda/sgl_kernel_shim.py`);
* otherwise nothing (`import sgl_kernel` fails as it would without us).

This module runs in every Python process of the environment (the `.pth` imports it), so it
imports only modules the interpreter has already loaded at startup (no dataclasses, no typing).
"""

from __future__ import annotations

import enum
import importlib
import importlib.machinery
import os
import sys
from collections import namedtuple
from types import ModuleType

_CPU_SHIMS = {
    "sgl_kernel": "sglang_echo.platform.sgl_kernel_shim",
    "sgl_kernel.speculative": "sglang_echo.platform.sgl_kernel_shim_speculative",
}
_CUDA = "sglang_echo.platform.cuda"
_CUDA_SHIMS = {
    "sgl_kernel": f"{_CUDA}.sgl_kernel_shim",
    "sgl_kernel.utils": f"{_CUDA}.sgl_kernel_utils",
    "sgl_kernel.kvcacheio": f"{_CUDA}.sgl_kernel_kvcacheio",
    "sgl_kernel.quantization": f"{_CUDA}.sgl_kernel_quantization",
}
# Every shim module sets this to its mode's value, so a loaded `sgl_kernel` tells whose it is.
SHIM_MARKER = "__sglang_echo_shim__"


class ShimMode(enum.Enum):
    REAL = "real"  # a real sglang-kernel is installed: the platform provides nothing
    CPU = "cpu"  # SGLANG_USE_CPU_ENGINE=1: pure-torch *_cpu ops
    CUDA = "cuda"  # a CUDA device and no sglang-kernel: Triton / sglang-JIT ops
    OFF = "off"  # neither: `import sgl_kernel` fails as usual


class ModeDecision(namedtuple("ModeDecision", "mode reason")):
    """Which `sgl_kernel` the platform provides (``mode``: ShimMode) and why (``reason``, for logs).

    A namedtuple, not a dataclass: this module is imported by every interpreter start."""

    __slots__ = ()


def cpu_engine_selected() -> bool:
    return os.environ.get("SGLANG_USE_CPU_ENGINE", "0") == "1"


def cuda_device_present() -> bool:
    """True where torch (a CUDA build, not ROCm) sees a device; False where torch is not importable."""
    try:
        import torch
    except ImportError:
        return False
    return torch.version.cuda is not None and torch.version.hip is None and bool(torch.cuda.is_available())


def real_sgl_kernel_origin() -> str | None:
    """Where a real `sgl_kernel` would be imported from (None: not installed), asking every finder but ours."""
    loaded = sys.modules.get("sgl_kernel")
    if loaded is not None:
        return None if getattr(loaded, SHIM_MARKER, None) else str(getattr(loaded, "__file__", "<loaded>"))
    for finder in sys.meta_path:
        if isinstance(finder, SglKernelShimFinder) or not hasattr(finder, "find_spec"):
            continue
        try:
            spec = finder.find_spec("sgl_kernel", None)
        except (ImportError, ValueError):
            continue
        if spec is not None:
            return str(spec.origin or spec.submodule_search_locations or "<found>")
    return None


def platform_mode() -> ModeDecision:
    """The one place that decides which `sgl_kernel` (if any) this process gets, and why."""
    origin = real_sgl_kernel_origin()
    if origin is not None:
        return ModeDecision(ShimMode.REAL, f"a real sgl_kernel is installed ({origin})")
    if cpu_engine_selected():
        return ModeDecision(ShimMode.CPU, "SGLANG_USE_CPU_ENGINE=1 and no sgl_kernel installed")
    if cuda_device_present():
        return ModeDecision(ShimMode.CUDA, "torch sees a CUDA device and no sgl_kernel is installed")
    return ModeDecision(ShimMode.OFF, "no sgl_kernel installed, no CUDA device, SGLANG_USE_CPU_ENGINE unset")


def shims_for(mode: ShimMode) -> dict[str, str]:
    """`sgl_kernel[.sub]` name -> our module, for one mode (empty where the platform provides nothing)."""
    return {ShimMode.CPU: _CPU_SHIMS, ShimMode.CUDA: _CUDA_SHIMS}.get(mode, {})


class _AliasLoader:
    """Loads `sgl_kernel[.x]` as an alias of one of our modules (importlib's Loader protocol)."""

    def __init__(self, target: str) -> None:
        self._target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self._target)

    def exec_module(self, module: ModuleType) -> None:  # already executed by import_module
        pass


class SglKernelShimFinder:
    """importlib's MetaPathFinder protocol; answers only for `sgl_kernel` and its shimmed submodules."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "sgl_kernel" and not fullname.startswith("sgl_kernel."):
            return None
        shims = shims_for(platform_mode().mode)
        if fullname not in shims:
            return None
        return importlib.machinery.ModuleSpec(
            fullname, _AliasLoader(shims[fullname]), is_package=fullname == "sgl_kernel"
        )


def install() -> None:
    """Idempotently append the finder to sys.meta_path."""
    if not any(isinstance(f, SglKernelShimFinder) for f in sys.meta_path):
        sys.meta_path.append(SglKernelShimFinder())
