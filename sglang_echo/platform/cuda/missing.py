"""The `sgl_kernel` names sglang imports on the CUDA path of Llama-family models but never calls there.

sglang imports most of them at module import time under `if _is_cuda:` (MoE, GGUF, int8 and
Gemma layers, HiCache host-memory transfers), so they must import for the server to start; the
others in functions of modules on the path. Calling one means a model or feature the platform
does not cover: the stub raises NotImplementedError naming the op.
`tests/platform/test_cuda_shim_coverage.py` checks this table against sglang's source (every name
here is imported on the path; none is imported under a `try: ... except ImportError` fallback,
which a stub would defeat).
"""

from __future__ import annotations

from typing import Callable, NoReturn

MISSING: dict[str, tuple[str, ...]] = {
    "sgl_kernel": (
        "fused_experts",  # layers/quantization/unquant.py: the sgl-kernel (XPU) MoE runner
        "gemma_fused_add_rmsnorm",  # layers/layernorm.py: Gemma norms
        "gemma_rmsnorm",
        "int8_scaled_mm",  # layers/quantization/w8a8_int8.py, compressed_tensors_w8a8_int8.py
        "moe_sum",  # layers/quantization/gguf.py
        "moe_sum_reduce",  # layers/moe/moe_runner/triton_utils/fused_moe.py, fused_marlin_moe.py
    ),
    "sgl_kernel.kvcacheio": (  # mem_cache/memory_pool_host.py, pool_host/*: HiCache (host KV offload)
        "transfer_kv_all_layer",
        "transfer_kv_all_layer_direct_lf_pf",
        "transfer_kv_all_layer_lf_pf",
        "transfer_kv_all_layer_lf_ph",
        "transfer_kv_all_layer_mla",
        "transfer_kv_all_layer_mla_lf_pf",
        "transfer_kv_direct",
        "transfer_kv_per_layer",
        "transfer_kv_per_layer_direct_pf_lf",
        "transfer_kv_per_layer_mla",
        "transfer_kv_per_layer_mla_pf_lf",
        "transfer_kv_per_layer_pf_lf",
        "transfer_kv_per_layer_ph_lf",
    ),
    "sgl_kernel.quantization": (  # layers/quantization/gguf.py
        "ggml_dequantize",
        "ggml_moe_a8",
        "ggml_mul_mat_a8",
        "ggml_mul_mat_vec_a8",
    ),
}


def missing_op(module: str, name: str) -> Callable[..., NoReturn]:
    """A callable named ``name`` that raises NotImplementedError naming ``module.name`` when called."""

    def stub(*_args, **_kwargs) -> NoReturn:
        raise NotImplementedError(
            f"{module}.{name} is not provided by sglang-echo's platform (CUDA mode, no sglang-kernel "
            "installed): it covers Llama-family dense models with --attention-backend triton; "
            "install sglang-kernel for this model or feature"
        )

    stub.__name__ = stub.__qualname__ = name
    stub.__module__ = module
    stub.sglang_echo_missing = True  # type: ignore[attr-defined]
    return stub


def stubs(module: str) -> dict[str, Callable[..., NoReturn]]:
    """The stubs of one `sgl_kernel` module, to merge into its shim's globals."""
    return {name: missing_op(module, name) for name in MISSING[module]}
