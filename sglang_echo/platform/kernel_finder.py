"""Provide a pure-torch `sgl_kernel` module, only where the real one is missing on the CPU engine.

Why a meta-path finder: with `SGLANG_USE_CPU_ENGINE=1` sglang does `from sgl_kernel import
..._cpu` at MODULE IMPORT time (e.g. sglang/kernels/ops/kvcache/cache_move.py), and in the
scheduler subprocess that import happens while unpickling the process target, before
`sglang.srt.plugins.load_plugins()` runs there. So no sglang plugin hook is early enough; the
finder is installed by the one-line `sglang_echo_platform.pth` (see install.py) at interpreter
start, and again (idempotently) by our general plugin in the launching process.

Safety: the finder is APPENDED to `sys.meta_path`, so a real installed `sgl_kernel` is always
found first by the normal path finder and this one is never consulted (GPU machines are
untouched). It also answers only when `SGLANG_USE_CPU_ENGINE=1`. This module imports nothing
heavy: it runs in every Python process of the environment.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType

_SHIMS = {
    "sgl_kernel": "sglang_echo.platform.sgl_kernel_shim",
    "sgl_kernel.speculative": "sglang_echo.platform.sgl_kernel_shim_speculative",
}


def cpu_engine_selected() -> bool:
    return os.environ.get("SGLANG_USE_CPU_ENGINE", "0") == "1"


class _AliasLoader(importlib.abc.Loader):
    """Loads `sgl_kernel[.x]` as an alias of one of our modules."""

    def __init__(self, target: str) -> None:
        self._target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self._target)

    def exec_module(self, module: ModuleType) -> None:  # already executed by import_module
        pass


class SglKernelShimFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):  # type: ignore[override]
        if fullname not in _SHIMS or not cpu_engine_selected():
            return None
        is_pkg = fullname == "sgl_kernel"
        return importlib.util.spec_from_loader(
            fullname, _AliasLoader(_SHIMS[fullname]), is_package=is_pkg
        )


def install() -> None:
    """Idempotently append the finder to sys.meta_path."""
    if not any(isinstance(f, SglKernelShimFinder) for f in sys.meta_path):
        sys.meta_path.append(SglKernelShimFinder())
