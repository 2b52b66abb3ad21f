"""General sglang plugin (entry point group `sglang.srt.plugins`, name `echo_cpu`).

sglang calls `load_plugins()` early in every process it starts (launch_server main before
argument resolution, scheduler, detokenizer, DP controller). It logs
`kernel_finder.platform_mode()`. In CUDA mode (a CUDA device, no sglang-kernel, CPU engine not
selected) it installs the finder and registers `cuda.hooks` (environment defaults, the dual-GEMM
/ BF16-GEMM fallbacks, top-k/top-p renorm for sampled verify). Elsewhere without
`SGLANG_USE_CPU_ENGINE=1` (a real sglang-kernel on a GPU, or no device) it does nothing. On a
CPU-engine process it:
1. installs the `sgl_kernel` shim finder (idempotent; the .pth already did it at startup),
2. registers the `echo_torch` attention backend in sglang's backend registry and CLI choices,
3. teaches sglang's EAGLE `DraftBackendFactory` to build `echo_torch` draft backends (its
   backend map is a local dict, so an AROUND hook via HookRegistry is the only seam),
4. makes speculative verify (EAGLE/EAGLE3, NGRAM and both ECHO workers all verify through
   `eagle_utils.eagle_sample`) sample at temperature > 0 instead of committing the argmax; see
   `_verify_uses_greedy` and `_bind_verify_sampling_ops` below;
5. runs unquantized linears and plain LM heads on oneDNN-prepacked weights (`packed_linear`:
   about 2x faster at decode/verify shapes, and batch invariant);
6. with ``SGLANG_ECHO_STEP_TIMES=1``, logs the scheduler's step time per kind and batch size
   (`step_times`), for servers with and without speculation alike;
7. forks sglang's scheduler and detokenizer instead of spawning them (`fork_children`: no
   CUDA context to protect, and a server starts in two thirds of the time).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Callable

from sglang_echo.platform import deterministic, fork_children, kernel_finder, packed_linear, step_times
from sglang_echo.platform.attention import BACKEND_NAME

logger = logging.getLogger(__name__)


def _create_backend(runner: Any) -> Any:
    from sglang_echo.platform.attention.backend import EchoTorchAttnBackend

    return EchoTorchAttnBackend(runner)


def _uses_echo(factory: Any) -> bool:
    from sglang.srt.runtime_context import attention_backends

    return BACKEND_NAME in (factory.draft_attn_backend, *attention_backends())


def _stamp(backend: Any) -> Any:
    backend.prefill_attention_backend_str = BACKEND_NAME
    backend.decode_attention_backend_str = BACKEND_NAME
    return backend


def _draft_decode_backend(original: Callable[..., Any], factory: Any) -> Any:
    if not _uses_echo(factory):
        return original(factory)
    if factory.speculative_num_steps <= 1:  # same rule as the in-tree factory
        return None
    from sglang_echo.platform.attention.draft import EchoTorchMultiStepDraftBackend

    multi = EchoTorchMultiStepDraftBackend(factory.draft_model_runner, factory.topk, factory.speculative_num_steps)
    for child in multi.attn_backends:
        _stamp(child)
    return _stamp(multi)


def _draft_extend_backend(original: Callable[..., Any], factory: Any) -> Any:
    if not _uses_echo(factory):
        return original(factory)
    return _stamp(_create_backend(factory.draft_model_runner))


_EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"


def _verify_uses_greedy(original: Callable[..., bool], **kwargs: Any) -> bool:
    """AROUND `eagle_utils._verify_uses_greedy`: the CPU no longer forces greedy verify.

    sglang returns `is_all_greedy or is_cpu or ...` because it has no CPU sampling-verify
    kernel, so on CPU every sampled request silently got the target's argmax from each verify
    step. We provide that kernel (`ops.spec_sampling`), so only the CPU term is dropped: an
    all-greedy batch still takes the greedy path (`verify_tree_greedy`), every other term is
    sglang's own. `eagle_sample` calls it with keyword arguments only (its signature is
    keyword-only), and looks the name up in its module globals at call time.
    """
    return original(**{**kwargs, "is_cpu": False})


def _bind_verify_sampling_ops() -> None:
    """Give `eagle_utils` the sampling-verify ops that sglang resolves to None on CPU.

    `eagle_sample`'s sampling branch calls the module globals `tree_speculative_sampling_target_only`
    and, for requests with top-k / top-p, `top_k_renorm_prob` / `top_p_renorm_prob`. sglang's
    per-platform resolvers (`kernels/ops/speculative/verify_sampling.py`,
    `kernels/ops/sampling/renorm.py`) set them to None on CPU and `eagle_utils` copies them at
    import (`from ... import`). HookRegistry cannot patch them: its REPLACE on an attribute whose
    original is None would, through `_propagate_patch` (it rebinds every module global that `is`
    the original), overwrite every None-valued global of every loaded module. So they are bound
    directly, in `eagle_utils` only, and only while still None (a real kernel is never replaced).
    """
    from sglang_echo.platform.ops import spec_sampling

    eagle_utils = importlib.import_module(_EAGLE_UTILS)
    for name in ("tree_speculative_sampling_target_only", "top_k_renorm_prob", "top_p_renorm_prob"):
        if getattr(eagle_utils, name) is None:
            setattr(eagle_utils, name, getattr(spec_sampling, name))


def register() -> None:
    decision = kernel_finder.platform_mode()
    if kernel_finder.cpu_engine_selected():  # with a real sgl_kernel too (the finder then provides none)
        _register_cpu()
    elif decision.mode is kernel_finder.ShimMode.CUDA:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        from sglang_echo.platform.cuda import hooks as cuda_hooks

        kernel_finder.install()
        cuda_hooks.register(HookRegistry, HookType.AROUND)
    logger.info("sglang_echo platform: %s mode (%s)", decision.mode.value, decision.reason)


def _register_cpu() -> None:
    kernel_finder.install()

    from sglang.srt.arg_groups.choices import (
        ATTENTION_BACKEND_CHOICES,
        add_attention_backend_choices,
        add_draft_attention_backend_choices,
    )
    from sglang.srt.layers.attention.attention_registry import (
        ATTENTION_BACKENDS,
        register_attention_backend,
    )
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
        add_draft_attention_backend_choices([BACKEND_NAME])
    if BACKEND_NAME not in ATTENTION_BACKENDS:
        register_attention_backend(BACKEND_NAME)(_create_backend)

    factory = "sglang.srt.speculative.draft_utils.DraftBackendFactory"
    HookRegistry.register(f"{factory}.create_decode_backend", _draft_decode_backend, HookType.AROUND)
    HookRegistry.register(f"{factory}.create_draft_extend_backend", _draft_extend_backend, HookType.AROUND)

    # Sampled speculative verify. Importing eagle_utils here costs nothing extra: HookRegistry
    # resolves the hook target (same module) right after, and every launcher/scheduler imports it.
    _bind_verify_sampling_ops()
    HookRegistry.register(f"{_EAGLE_UTILS}._verify_uses_greedy", _verify_uses_greedy, HookType.AROUND)
    packed_linear.register(HookRegistry, HookType.AROUND)
    deterministic.register(HookRegistry, HookType.AROUND)  # --enable-deterministic-inference
    step_times.register(HookRegistry, HookType.AROUND)
    fork_children.register(HookRegistry, HookType.AROUND)
    logger.info("sglang_echo CPU platform: registered attention backend %r", BACKEND_NAME)
