"""The CUDA `sgl_kernel` shim covers what sglang imports from `sgl_kernel` on the platform's CUDA path.

One fresh interpreter imports the server's modules as on an H200 without sglang-kernel
(`fake_cuda_probe`): that they import is the first check, and the `sglang.*` modules it loaded are
the path. Their source is then read (`sgl_kernel_imports`): every `sgl_kernel` import that runs
at import time there, and every one inside a function of :data:`CALL_PATH` (the modules whose
functions a Llama-family server with Triton attention, the torch sampler, CUDA graphs and
NGRAM / EAGLE / EAGLE3 runs), must be provided. A new sglang that imports another name fails here.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from sglang_echo.platform.cuda import missing
from sglang_echo.platform.kernel_finder import ShimMode, shims_for
from tests.platform import fake_cuda_probe
from tests.platform.sgl_kernel_imports import KernelImport, collect, evaluate, module_files

ROOT = Path(__file__).resolve().parents[2]
# The project's own sglang plugin and ECHO workers: they load on the same servers.
ECHO_MODULES = ("sglang_echo.plugin", "sglang_echo.integration.worker", "sglang_echo.integration.ngram_worker")
CALL_PATH = (
    "sglang.srt.layers.layernorm",
    "sglang.srt.layers.activation",
    "sglang.srt.layers.rotary_embedding.base",
    "sglang.srt.layers.linear",
    "sglang.srt.layers.quantization.unquant",
    "sglang.srt.layers.dual_gemm",
    "sglang.srt.layers.vocab_parallel_embedding",
    "sglang.srt.layers.logits_processor",
    "sglang.srt.layers.sampler",
    "sglang.srt.layers.radix_attention",
    "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.models.llama",
    "sglang.srt.models.llama_eagle",
    "sglang.srt.models.llama_eagle3",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.allocation",
    "sglang.srt.managers.scheduler",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
    "sglang.srt.model_executor.runner.prefill_cuda_graph_runner",
    "sglang.srt.model_executor.runner_backend.breakable_cuda_graph_backend",
    "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph",
    "sglang.srt.model_executor.runner_backend_utils.weak_ref_tensor",
    "sglang.srt.speculative.eagle_utils",
    "sglang.srt.speculative.eagle_info",
    "sglang.srt.speculative.eagle_worker_v2",
    "sglang.srt.speculative.standalone_worker_v2",
    "sglang.srt.speculative.draft_utils",
    "sglang.srt.speculative.eagle_draft_cuda_graph_runner",
    "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner",
    "sglang.srt.speculative.ngram_worker",
    "sglang.srt.speculative.ngram_info",
    "sglang.kernels.ops.layernorm.norm",
    "sglang.kernels.ops.attention.rope",
    "sglang.kernels.ops.sampling.renorm",
    "sglang.kernels.ops.kvcache.cache_move",
    "sglang.kernels.ops.speculative.spec_tree",
    "sglang.kernels.ops.speculative.eagle",
    "sglang.kernels.ops.speculative.cache_locs",
    "sglang.kernels.ops.speculative.reconstruct_tree",
    "sglang.kernels.ops.speculative.verify_sampling",
    "sglang.srt.utils.common",
)


@pytest.fixture(scope="module")
def probe() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_USE_CPU_ENGINE"}
    modules = [*fake_cuda_probe.SERVER_MODULES, *ECHO_MODULES]
    r = subprocess.run(
        [sys.executable, "-m", "tests.platform.fake_cuda_probe", *modules],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def uses(probe) -> list[KernelImport]:
    root = Path(sysconfig.get_paths()["purelib"])
    return [hit for module, path in module_files(probe["sglang_modules"], root) for hit in collect(path, module)]


def _shim(source: str):
    return importlib.import_module(shims_for(ShimMode.CUDA)[source])


def _on_path(hit: KernelImport) -> bool:
    return not hit.in_function or hit.module in CALL_PATH


def test_server_modules_import_with_the_cuda_shim(probe) -> None:
    assert probe["errors"] == {}
    assert probe["mode"] == "cuda"
    assert probe["sgl_kernel"] == {k: v for k, v in shims_for(ShimMode.CUDA).items() if k in probe["sgl_kernel"]}
    assert set(CALL_PATH) <= set(probe["sglang_modules"])  # the list names modules the server loads


def test_every_sgl_kernel_import_on_the_path_is_provided(uses) -> None:
    required = [h for h in uses if _on_path(h) and not h.guarded]
    assert len({(h.source, h.name) for h in required}) >= 30  # the AST walk found sglang's imports
    absent = sorted(
        {
            f"{h.source}.{h.name or ''} ({h.module}:{h.line})"
            for h in required
            if h.source not in shims_for(ShimMode.CUDA) or (h.name is not None and not hasattr(_shim(h.source), h.name))
        }
    )
    assert absent == []


def test_guarded_imports_keep_sglangs_fallback(uses) -> None:
    """A stub would turn sglang's `except ImportError:` fallback into a NotImplementedError at call time."""
    guarded = {(h.source, h.name) for h in uses if h.guarded and h.name is not None}
    assert guarded  # sgl_kernel.scalar_type (sglang's quantization utils mock it when missing)
    stubbed = {(module, name) for module, names in missing.MISSING.items() for name in names}
    assert guarded & stubbed == set()
    assert "sgl_kernel.scalar_type" not in shims_for(ShimMode.CUDA)


def test_missing_table_lists_only_names_on_the_path(uses) -> None:
    on_path = {(h.source, h.name) for h in uses if _on_path(h)}
    dead = [
        (module, name) for module, names in missing.MISSING.items() for name in names if (module, name) not in on_path
    ]
    assert dead == []


SOURCE = """
import sgl_kernel
if _is_cuda or _is_hip:
    from sgl_kernel import on_cuda
else:
    from sgl_kernel import off_cuda
if _is_npu:
    from sgl_kernel import on_npu
if _is_cuda and some_flag:
    from sgl_kernel.utils import maybe
try:
    from sgl_kernel.scalar_type import guarded
except ImportError:
    pass
def f():
    if not is_cuda():
        from sgl_kernel import never
    return sgl_kernel.attr_use + torch.ops.sgl_kernel.not_this
"""


def test_ast_walk_follows_cuda_branches(tmp_path) -> None:
    path = tmp_path / "m.py"
    path.write_text(SOURCE)
    got = {(h.source, h.name, h.in_function, h.guarded) for h in collect(path, "m")}
    assert got == {
        ("sgl_kernel", None, False, False),
        ("sgl_kernel", "on_cuda", False, False),
        ("sgl_kernel.utils", "maybe", False, False),
        ("sgl_kernel.scalar_type", "guarded", False, True),
        ("sgl_kernel", "attr_use", True, False),
    }
    cond = lambda text: evaluate(ast.parse(text, mode="eval").body)  # noqa: E731
    assert [cond(t) for t in ("_is_cuda", "not is_cuda()", "_is_hip or x", "_is_hip and x", "x or _is_cuda")] == [
        True,
        False,
        None,
        False,
        True,
    ]
