"""The CPU sgl_kernel shim appears only on the CPU engine and never shadows a real sgl_kernel (CUDA
mode, which also answers without the CPU engine where a GPU is visible: test_cuda_mode.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sglang_echo.platform import kernel_finder
from sglang_echo.platform.kernel_finder import SglKernelShimFinder

PROBE = (
    "from sglang_echo.platform import kernel_finder; kernel_finder.install();"
    "import sgl_kernel; print(getattr(sgl_kernel, '__version__', 'real'))"
)


def _probe(env_cpu: bool, extra_path: Path | None = None) -> subprocess.CompletedProcess:
    # No GPU visible: on a GPU host CUDA mode would provide its own shim (test_cuda_mode.py).
    env = {"PATH": "/usr/bin:/bin", "SGLANG_USE_CPU_ENGINE": "1" if env_cpu else "0", "CUDA_VISIBLE_DEVICES": ""}
    if extra_path is not None:
        env["PYTHONPATH"] = str(extra_path)
    return subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env)


def test_finder_answers_only_for_cpu_engine(monkeypatch) -> None:
    f = SglKernelShimFinder()
    monkeypatch.setattr(kernel_finder, "cuda_device_present", lambda: False)
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "0")
    assert f.find_spec("sgl_kernel") is None
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    spec = f.find_spec("sgl_kernel")
    assert spec is not None and spec.loader._target == "sglang_echo.platform.sgl_kernel_shim"
    assert f.find_spec("sgl_kernel.speculative") is not None
    assert f.find_spec("sgl_kernel.utils") is None  # a CUDA-mode submodule
    assert f.find_spec("numpy") is None


def test_shim_absent_without_cpu_engine() -> None:
    assert _probe(env_cpu=False).returncode != 0  # ModuleNotFoundError: nothing provided


def test_shim_present_with_cpu_engine() -> None:
    r = _probe(env_cpu=True)
    assert r.returncode == 0 and "sglang_echo.cpu" in r.stdout


def test_real_sgl_kernel_wins(tmp_path: Path) -> None:
    (tmp_path / "sgl_kernel").mkdir()
    (tmp_path / "sgl_kernel" / "__init__.py").write_text("")
    r = _probe(env_cpu=True, extra_path=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "real"
