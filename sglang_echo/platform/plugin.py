"""General sglang plugin (entry point group `sglang.srt.plugins`, name `echo_cpu`).

sglang calls `load_plugins()` early in every process it starts (launch_server main before
argument resolution, scheduler, detokenizer, DP controller). On a CPU-engine process this:
1. installs the `sgl_kernel` shim finder (idempotent; the .pth already did it at startup),
2. registers the `echo_torch` attention backend in sglang's backend registry and CLI choices,
3. teaches sglang's EAGLE `DraftBackendFactory` to build `echo_torch` draft backends (its
   backend map is a local dict, so an AROUND hook via HookRegistry is the only seam).
On any other process (GPU servers) it does nothing.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from sglang_echo.platform import kernel_finder
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

    multi = EchoTorchMultiStepDraftBackend(
        factory.draft_model_runner, factory.topk, factory.speculative_num_steps
    )
    for child in multi.attn_backends:
        _stamp(child)
    return _stamp(multi)


def _draft_extend_backend(original: Callable[..., Any], factory: Any) -> Any:
    if not _uses_echo(factory):
        return original(factory)
    return _stamp(_create_backend(factory.draft_model_runner))


def register() -> None:
    if not kernel_finder.cpu_engine_selected():
        return
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
    logger.info("sglang_echo CPU platform: registered attention backend %r", BACKEND_NAME)
