"""Import sglang's server modules as on an H200 without sglang-kernel, with the platform's finder.

Run as a script (a fresh interpreter: sglang resolves its platform once per process):

    python -m tests.platform.fake_cuda_probe MODULE...

torch is made to report one SM90 CUDA device (nothing is ever launched: the modules are only
imported), the platform's finder is installed, and each MODULE is imported. Prints one JSON
object: ``errors`` (module -> repr of the exception), ``sglang_modules`` (every `sglang.*` module
then loaded, i.e. what the server imports on that path), ``sgl_kernel`` (each loaded
`sgl_kernel[.x]` -> the module that provides it) and ``mode`` (kernel_finder.platform_mode).
"""

from __future__ import annotations

import importlib
import json
import sys

import torch


class _Props:
    major, minor, multi_processor_count = 9, 0, 132
    name, uuid, gcnArchName = "NVIDIA H200", "GPU-fake", ""
    total_memory = 141 << 30


def fake_cuda() -> None:
    """torch reports one SM90 device; only what module imports ask."""
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.get_device_name = lambda *a, **k: _Props.name
    torch.cuda.get_device_properties = lambda *a, **k: _Props()
    if torch.version.cuda is None:
        torch.version.cuda = "13.0"


# The processes of a server (launcher, scheduler with model runner, detokenizer) and what they
# load for a Llama-family target with --attention-backend triton, --sampling-backend pytorch, CUDA
# graphs, and NGRAM / EAGLE / EAGLE3 speculation.
SERVER_MODULES = (
    "sglang.launch_server",
    "sglang.srt.entrypoints.engine",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
    "sglang.srt.model_executor.runner.prefill_cuda_graph_runner",
    "sglang.srt.model_executor.runner_backend.breakable_cuda_graph_backend",
    "sglang.srt.model_executor.runner_backend.full_cuda_graph_backend",
    "sglang.srt.model_executor.runner_backend_utils.weak_ref_tensor",
    "sglang.srt.compilation.cuda_piecewise_backend",
    "sglang.srt.models.llama",
    "sglang.srt.models.llama_eagle",
    "sglang.srt.models.llama_eagle3",
    "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.layers.sampler",
    "sglang.srt.layers.dual_gemm",
    "sglang.srt.speculative.eagle_worker_v2",
    "sglang.srt.speculative.standalone_worker_v2",
    "sglang.srt.speculative.ngram_worker",
    "sglang.srt.speculative.eagle_utils",
    "sglang.srt.speculative.draft_utils",
    "sglang.srt.speculative.eagle_draft_cuda_graph_runner",
    "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner",
)


def main(modules: list[str]) -> None:
    fake_cuda()
    from sglang_echo.platform import kernel_finder

    kernel_finder.install()
    errors = {}
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # reported, not raised: the caller asserts on them
            errors[name] = repr(e)
    decision = kernel_finder.platform_mode()
    print(
        json.dumps(
            {
                "errors": errors,
                "mode": decision.mode.value,
                "sglang_modules": sorted(m for m in sys.modules if m == "sglang" or m.startswith("sglang.")),
                "sgl_kernel": {
                    m: getattr(sys.modules[m], "__name__", "?")
                    for m in sorted(sys.modules)
                    if m == "sgl_kernel" or m.startswith("sgl_kernel.")
                },
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:] or list(SERVER_MODULES))
