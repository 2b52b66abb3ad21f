"""The sgl_kernel shim must appear only on the CPU engine and never shadow a real sgl_kernel."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sglang_echo.platform.kernel_finder import SglKernelShimFinder

PROBE = (
    "from sglang_echo.platform import kernel_finder; kernel_finder.install();"
    "import sgl_kernel; print(getattr(sgl_kernel, '__version__', 'real'))"
)


def _probe(env_cpu: bool, extra_path: Path | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "SGLANG_USE_CPU_ENGINE": "1" if env_cpu else "0"}
    if extra_path is not None:
        env["PYTHONPATH"] = str(extra_path)
    return subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env)


def test_finder_answers_only_for_cpu_engine(monkeypatch) -> None:
    f = SglKernelShimFinder()
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "0")
    assert f.find_spec("sgl_kernel") is None
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    assert f.find_spec("sgl_kernel") is not None
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
