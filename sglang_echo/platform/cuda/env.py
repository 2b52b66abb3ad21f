"""The environment sglang reads that CUDA mode sets, in one place (applied by `hooks.register`).

Each is a default: a value already in the environment is never replaced. They are set in the
launching process when the plugin loads (before sglang parses its arguments), so the scheduler
and detokenizer processes inherit them.

* ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python``: sglang's bundled Rust prefix-cache core is
  compiled against the torch sglang pins (2.14) and misreads tensor dtypes under another torch
  (seen with torch 2.11 on a bare GPU host); the Python core is the same tree.
* ``SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1``: at launch on CUDA sglang asserts that the
  sglang-kernel distribution is installed and recent (`entrypoints/engine.py`); the platform
  stands in for it.
* ``CUDA_HOME``, when neither it nor ``CUDA_PATH`` is set: ``/usr/local/cuda`` if it holds a
  toolkit (``bin/nvcc`` and ``include/``), else the root of the ``nvcc`` on ``PATH`` if that holds
  one. sglang JIT-compiles RoPE, tree building and tree verification (and the platform's norms)
  with nvcc through apache-tvm-ffi, which looks there; left to itself sglang takes the parent of
  the ``nvcc`` on ``PATH``, which is wrong for a wrapper such as ``/usr/local/bin/nvcc``.
"""

from __future__ import annotations

import os
import shutil
from typing import MutableMapping, Optional

CUDA_ENV_DEFAULTS: dict[str, str] = {
    "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python",
    "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",
}
DEFAULT_CUDA_ROOT = "/usr/local/cuda"


def _toolkit(root: str) -> bool:
    return os.access(os.path.join(root, "bin", "nvcc"), os.X_OK) and os.path.isdir(os.path.join(root, "include"))


def cuda_home_default(environ: MutableMapping[str, str]) -> Optional[str]:
    """CUDA_HOME to set: None where CUDA_HOME or CUDA_PATH is set or no toolkit is found."""
    if environ.get("CUDA_HOME") or environ.get("CUDA_PATH"):
        return None
    if _toolkit(DEFAULT_CUDA_ROOT):
        return DEFAULT_CUDA_ROOT
    nvcc = shutil.which("nvcc", path=environ.get("PATH"))
    root = os.path.dirname(os.path.dirname(nvcc)) if nvcc else None
    return root if root and _toolkit(root) else None


def env_defaults(environ: MutableMapping[str, str]) -> dict[str, str]:
    """The variables CUDA mode would add to ``environ`` (those not already set)."""
    added = {k: v for k, v in CUDA_ENV_DEFAULTS.items() if k not in environ}
    home = cuda_home_default(environ)
    if home is not None:
        added["CUDA_HOME"] = home
    return added


def apply_env_defaults(environ: Optional[MutableMapping[str, str]] = None) -> dict[str, str]:
    """Set :func:`env_defaults` in ``environ`` (default ``os.environ``); returns what was set."""
    environ = os.environ if environ is None else environ
    added = env_defaults(environ)
    environ.update(added)
    return added
