"""What the platform plugin registers in CUDA mode (no sglang-kernel on a CUDA host).

Besides `sgl_kernel` itself (the finder), sglang's Llama path on CUDA reaches three things a bare
host lacks; each gets sglang's own fallback through a hook or a binding, never an edit:

* the CuTe DSL dual GEMM (`sglang/srt/layers/dual_gemm.py`): `DualGemm._select_mode` imports
  `sglang.kernels.ops.gemm.cutedsl_dual_gemm`, which needs nvidia-cutlass-dsl (`cutlass`); without
  it building a Llama MLP fails. AROUND hook: no `cutlass`, no dual GEMM (mode None, sglang's
  unfused gate/up projection), as on any GPU the kernel does not support;
* the CuTe DSL BF16 GEMM that ``--bf16-gemm-backend auto`` picks on SM100
  (`quantization/unquant.py: initialize_bf16_gemm_config`), which needs `cutlass` too. AROUND
  hook: without `cutlass`, ``auto`` resolves as it does on other GPUs (cuBLAS through torch).
  An explicit ``--bf16-gemm-backend cutedsl`` is left to fail loudly;
* FlashInfer's top-k / top-p renormalisation, which sampled speculative verify calls for requests
  with top-k / top-p (`eagle_utils.eagle_sample`; `kernels/ops/sampling/renorm.py` resolves them
  to a lazy FlashInfer import on CUDA). Without flashinfer they are bound, in `eagle_utils` only,
  to the platform's torch versions (`ops.spec_sampling`), as the CPU mode does.

`register` also applies the environment defaults of `env.py`.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from typing import Any, Callable, Optional

logger = logging.getLogger(__name__)

DUAL_GEMM_TARGET = "sglang.srt.layers.dual_gemm.DualGemm._select_mode"
BF16_GEMM_TARGET = "sglang.srt.layers.quantization.unquant.initialize_bf16_gemm_config"
EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"
RENORM_OPS = ("top_k_renorm_prob", "top_p_renorm_prob")


def cutlass_dsl_present() -> bool:
    """nvidia-cutlass-dsl (import name `cutlass`), which sglang's CuTe DSL kernels import."""
    return importlib.util.find_spec("cutlass") is not None


def dual_gemm_mode(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Optional[Any]:
    """AROUND `DualGemm._select_mode`: None (dual GEMM unusable) without `cutlass`, else sglang's choice."""
    if not cutlass_dsl_present():
        return None
    return original(*args, **kwargs)


def bf16_gemm_config(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND `initialize_bf16_gemm_config`: without `cutlass`, ``auto`` does not pick the CuTe DSL GEMM."""
    from sglang.srt.runtime_context import get_exec, get_platform, override_platform

    if not cutlass_dsl_present() and get_exec().kernel.bf16_gemm_backend == "auto" and get_platform().is_sm100:
        logger.info("sglang-echo CUDA platform: no nvidia-cutlass-dsl, BF16 GEMMs on cuBLAS (torch)")
        with override_platform(is_sm100=False):
            return original(*args, **kwargs)
    return original(*args, **kwargs)


def _unresolvable(op: Any) -> bool:
    """True for None or a sglang LazyImport whose package is not installed."""
    if op is None:
        return True
    from sglang.utils import LazyImport

    return isinstance(op, LazyImport) and importlib.util.find_spec(op.module_name.split(".")[0]) is None


def bind_renorm_ops() -> list[str]:
    """Bind the platform's top-k / top-p renorm into `eagle_utils` where sglang's would fail; returns
    the names bound. Set directly, not through HookRegistry: its REPLACE rebinds every module global
    that `is` the original, and a LazyImport object may be shared (see plugin._bind_verify_sampling_ops)."""
    from sglang_echo.platform.ops import spec_sampling

    eagle_utils = importlib.import_module(EAGLE_UTILS)
    bound = [name for name in RENORM_OPS if _unresolvable(getattr(eagle_utils, name, None))]
    for name in bound:
        setattr(eagle_utils, name, getattr(spec_sampling, name))
    return bound


def register(hook_registry: Any, around: Any) -> None:
    """Register CUDA mode's hooks on ``hook_registry`` (sglang's HookRegistry, hook type ``around``)."""
    from sglang_echo.platform.cuda import env

    added = env.apply_env_defaults()
    if added:
        logger.info("sglang-echo CUDA platform: environment defaults %s", added)
    hook_registry.register(DUAL_GEMM_TARGET, dual_gemm_mode, around)
    hook_registry.register(BF16_GEMM_TARGET, bf16_gemm_config, around)
    bound = bind_renorm_ops()
    if bound:
        logger.info(
            "sglang-echo CUDA platform: no flashinfer, speculative verify renormalises with %s "
            "from sglang_echo.platform.ops.spec_sampling",
            ", ".join(bound),
        )
