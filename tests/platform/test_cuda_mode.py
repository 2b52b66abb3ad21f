"""When the platform provides the CUDA `sgl_kernel`, and what else CUDA mode sets: the mode decision,
the finder's answers, the `.pth` line, the environment defaults, the launcher flags and the hooks."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_echo.platform import install, kernel_finder
from sglang_echo.platform.cuda import env as cuda_env
from sglang_echo.platform.cuda import hooks
from sglang_echo.platform.kernel_finder import SglKernelShimFinder, ShimMode, platform_mode
from sglang_echo.serve import flags
from sglang_echo.serve.flags import ServerOptions, build_command

ROOT = Path(__file__).resolve().parents[2]


def _mode_env(monkeypatch, *, cpu: bool, cuda: bool) -> None:
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1" if cpu else "0")
    monkeypatch.setattr(kernel_finder, "cuda_device_present", lambda: cuda)


def _fake_real_sgl_kernel(tmp_path: Path) -> Path:
    (tmp_path / "sgl_kernel").mkdir()
    (tmp_path / "sgl_kernel" / "__init__.py").write_text("")
    (tmp_path / "sgl_kernel" / "utils.py").write_text("")
    return tmp_path


@pytest.mark.parametrize(
    "cpu,cuda,want",
    [
        (False, True, ShimMode.CUDA),
        (True, True, ShimMode.CPU),  # the CPU engine asked for on a GPU host
        (True, False, ShimMode.CPU),
        (False, False, ShimMode.OFF),
    ],
)
def test_platform_mode(monkeypatch, cpu, cuda, want) -> None:
    _mode_env(monkeypatch, cpu=cpu, cuda=cuda)
    decision = platform_mode()
    assert decision.mode is want and decision.reason


@pytest.mark.parametrize("cpu", [False, True])
def test_real_sgl_kernel_wins(monkeypatch, tmp_path, cpu) -> None:
    _mode_env(monkeypatch, cpu=cpu, cuda=True)
    monkeypatch.delitem(sys.modules, "sgl_kernel", raising=False)
    monkeypatch.syspath_prepend(str(_fake_real_sgl_kernel(tmp_path)))
    importlib.invalidate_caches()
    decision = platform_mode()
    assert decision.mode is ShimMode.REAL and str(tmp_path) in decision.reason
    assert SglKernelShimFinder().find_spec("sgl_kernel") is None


def test_finder_provides_the_cuda_modules_only(monkeypatch) -> None:
    _mode_env(monkeypatch, cpu=False, cuda=True)
    finder = SglKernelShimFinder()
    for name, target in kernel_finder.shims_for(ShimMode.CUDA).items():
        spec = finder.find_spec(name)
        assert spec is not None and spec.loader._target == target
        assert target.startswith("sglang_echo.platform.cuda.")
    # CPU-only submodule; sgl_kernel.scalar_type: sglang has its own fallback for an ImportError.
    for name in ("sgl_kernel.speculative", "sgl_kernel.scalar_type", "sgl_kernel_npu", "numpy"):
        assert finder.find_spec(name) is None
    _mode_env(monkeypatch, cpu=False, cuda=False)
    assert finder.find_spec("sgl_kernel") is None


def test_cuda_device_present_excludes_rocm(monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.version, "hip", None)
    assert kernel_finder.cuda_device_present()
    monkeypatch.setattr(torch.version, "hip", "6.4")
    assert not kernel_finder.cuda_device_present()


PROBE = """
import json, sys
sys.path.insert(0, {root!r})
from tests.platform.fake_cuda_probe import fake_cuda
fake_cuda()
from sglang_echo.platform import kernel_finder
kernel_finder.install()
import sgl_kernel, sgl_kernel.utils
print(json.dumps([getattr(sgl_kernel, "__sglang_echo_shim__", "real"), kernel_finder.platform_mode().mode.value]))
"""


def _probe(extra_path: Path | None = None) -> list[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SGLANG_USE_CPU_ENGINE": "0"}
    if extra_path is not None:
        env["PYTHONPATH"] = str(extra_path)
    r = subprocess.run(
        [sys.executable, "-c", PROBE.format(root=str(ROOT))], capture_output=True, text=True, env=env, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_cuda_host_gets_the_cuda_shim_in_a_fresh_process() -> None:
    assert _probe() == ["cuda", "cuda"]


def test_cuda_host_with_real_sgl_kernel_gets_the_real_one(tmp_path) -> None:
    assert _probe(_fake_real_sgl_kernel(tmp_path)) == ["real", "real"]


def test_pth_line_installs_the_finder_without_importing_torch() -> None:
    code = (
        f"exec({install.PTH_LINE!r}); import sys; print(sorted(type(f).__name__ for f in sys.meta_path)); "
        "print('torch' in sys.modules)"
    )
    r = subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr
    finders, torch_loaded = r.stdout.strip().splitlines()
    assert "SglKernelShimFinder" in finders and torch_loaded == "False"


def _toolkit(root: Path) -> Path:
    (root / "include").mkdir(parents=True)
    (root / "bin").mkdir()
    (root / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (root / "bin" / "nvcc").chmod(0o755)
    return root


def test_env_defaults(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(cuda_env, "DEFAULT_CUDA_ROOT", str(tmp_path / "missing"))
    toolkit = _toolkit(tmp_path / "cuda-13")
    environ = {"PATH": str(toolkit / "bin"), "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "0"}
    added = cuda_env.apply_env_defaults(environ)
    assert added == {"SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python", "CUDA_HOME": str(toolkit)}
    assert environ["SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK"] == "0"  # the operator's value is kept
    assert cuda_env.apply_env_defaults(environ) == {}
    assert "CUDA_HOME" not in cuda_env.env_defaults({"PATH": str(toolkit / "bin"), "CUDA_PATH": "/opt/cuda"})
    assert "CUDA_HOME" not in cuda_env.env_defaults({"PATH": str(tmp_path)})  # no nvcc anywhere


def test_cuda_home_prefers_the_toolkit_over_an_nvcc_wrapper(tmp_path, monkeypatch) -> None:
    """A wrapper script such as /usr/local/bin/nvcc has no toolkit beside it."""
    wrapper = tmp_path / "local" / "bin" / "nvcc"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text('#!/bin/sh\nexec /usr/local/cuda-13.0/bin/nvcc "$@"\n')
    wrapper.chmod(0o755)
    environ = {"PATH": str(wrapper.parent)}
    monkeypatch.setattr(cuda_env, "DEFAULT_CUDA_ROOT", str(tmp_path / "missing"))
    assert cuda_env.cuda_home_default(environ) is None
    monkeypatch.setattr(cuda_env, "DEFAULT_CUDA_ROOT", str(_toolkit(tmp_path / "cuda")))
    assert cuda_env.cuda_home_default(environ) == str(tmp_path / "cuda")


def test_launcher_flags_on_a_cuda_host_without_sgl_kernel(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(flags, "sgl_kernel_installed", lambda: False)
    for name in cuda_env.CUDA_ENV_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    cmd = build_command(ServerOptions(model_path=tmp_path, device="cuda", extra_args=("--attention-backend", "fa3")))
    argv = " ".join(cmd.argv)
    assert "--attention-backend triton --sampling-backend pytorch" in argv
    assert argv.endswith("--attention-backend fa3")  # arguments after `--` come last, so they win
    assert cmd.env.items() >= cuda_env.CUDA_ENV_DEFAULTS.items()
    monkeypatch.setattr(flags, "sgl_kernel_installed", lambda: True)
    cmd = build_command(ServerOptions(model_path=tmp_path, device="cuda"))
    assert "--attention-backend" not in cmd.argv and "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK" not in cmd.env
    cpu = build_command(ServerOptions(model_path=tmp_path, device="cpu")).argv
    assert "echo_torch" in cpu and "triton" not in cpu


def test_dual_gemm_hook(monkeypatch) -> None:
    calls = []

    def original(*args):
        calls.append(args)
        return "UNQUANT"

    monkeypatch.setattr(hooks, "cutlass_dsl_present", lambda: False)
    assert hooks.dual_gemm_mode(original, "self", "gate_up", 4096) is None and calls == []
    monkeypatch.setattr(hooks, "cutlass_dsl_present", lambda: True)
    assert hooks.dual_gemm_mode(original, "self", "gate_up", 4096) == "UNQUANT"
    assert calls == [("self", "gate_up", 4096)]


PLUGIN_PROBE = """
import json, os, sys
sys.path.insert(0, {root!r})
from tests.platform.fake_cuda_probe import fake_cuda
fake_cuda()
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.layers.dual_gemm import DualGemm
from sglang.srt.layers.quantization import unquant
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang.srt.speculative import eagle_utils as e
from sglang_echo.platform.ops import spec_sampling as s
import sglang.kernels.ops.sampling.renorm as r
print(json.dumps(dict(
    env={{k: os.environ.get(k) for k in {names!r}}},
    dual_gemm=DualGemm._select_mode(None, None, 4096),
    patched=sorted(t for t in HookRegistry._patched if "dual_gemm" in t or "bf16_gemm" in t),
    renorm=[e.top_k_renorm_prob is s.top_k_renorm_prob, e.top_p_renorm_prob is s.top_p_renorm_prob],
    source_untouched=type(r.top_k_renorm_prob).__name__,
)))
"""


def test_plugin_in_cuda_mode() -> None:
    """load_plugins() on a (faked) CUDA host: env defaults, the dual-GEMM and BF16-GEMM hooks, renorm bound."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    code = PLUGIN_PROBE.format(root=str(ROOT), names=tuple(cuda_env.CUDA_ENV_DEFAULTS))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["env"] == cuda_env.CUDA_ENV_DEFAULTS
    assert got["dual_gemm"] is None  # no cutlass here: sglang's unfused MLP
    assert got["patched"] == sorted([hooks.BF16_GEMM_TARGET, hooks.DUAL_GEMM_TARGET])
    assert got["renorm"] == [True, True]
    assert got["source_untouched"] == "LazyImport"


@pytest.mark.parametrize(
    "cutlass,backend,sm100,want_sm100_inside",
    [
        (False, "auto", True, False),  # the one case changed: auto on SM100 without cutlass
        (True, "auto", True, True),
        (False, "cutedsl", True, True),  # asked for explicitly: sglang's own error
        (False, "auto", False, False),
    ],
)
def test_bf16_gemm_hook(monkeypatch, cutlass, backend, sm100, want_sm100_inside) -> None:
    from types import SimpleNamespace

    from sglang.srt import runtime_context

    monkeypatch.setattr(hooks, "cutlass_dsl_present", lambda: cutlass)
    monkeypatch.setattr(
        runtime_context, "get_exec", lambda: SimpleNamespace(kernel=SimpleNamespace(bf16_gemm_backend=backend))
    )
    seen = []
    with runtime_context.override_platform(is_sm100=sm100):
        assert hooks.bf16_gemm_config(lambda: seen.append(runtime_context.get_platform().is_sm100) or 7) == 7
        assert runtime_context.get_platform().is_sm100 is sm100  # restored after the call
    assert seen == [want_sm100_inside]
