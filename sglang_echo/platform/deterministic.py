"""The CPU platform's batch-invariant mode: sglang's ``--enable-deterministic-inference``.

In this mode a request's tokens do not depend on what else the server runs: greedy decoding at 1
and at 64 concurrent requests gives the same tokens, and so does greedy speculative decoding
(ECHO, EAGLE-3, NGRAM: a verified tree node is computed bit for bit as decoding that token
would), in bfloat16 as in float32. What varies with the batch on this platform, measured op by
op (a row alone vs inside batches of 2-2048 rows, bf16 and fp32, 1 and 2 threads):

* attention: the padded SDPA's reduction is blocked by the batch's longest request, and a tree
  node reaches its ancestors through other columns than decoding -> :mod:`.attention.invariant`;
* oneDNN's packed linears: the kernel, and so a row's bits, follow the number of rows in the
  call (one row alone for some shapes; on AMX, bf16 calls of more than 32 rows) -> every call runs
  at 2 to 32 rows (``packed_linear.set_batch_invariant``);
* not batch variant here: RMSNorm, rotary, SiLU-and-mul, embedding, argmax, softmax.

sglang's own switch (``ModelRunner.maybe_enable_batch_invariant_mode``) replaces aten's ``mm``,
``bmm``, ``addmm``, ``log_softmax``, ``mean`` and ``rms_norm`` with Triton kernels on a GPU and
raises on a CPU; on the CPU engine this module's hook turns on the platform's mode instead. The
attention backend reads the flag itself (:func:`enabled`).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from sglang_echo.platform import packed_linear
from sglang_echo.platform.attention import BACKEND_NAME

logger = logging.getLogger(__name__)

RUNNER_HOOK = "sglang.srt.model_executor.model_runner.ModelRunner.maybe_enable_batch_invariant_mode"


def enabled() -> bool:
    """True when the server runs with ``--enable-deterministic-inference`` (False where sglang has
    published no configuration, e.g. in unit tests)."""
    from sglang.srt.runtime_context import get_exec

    try:
        return bool(get_exec().deterministic.enable_deterministic_inference)
    except (ValueError, AttributeError, KeyError):
        return False


def enable_batch_invariant_ops() -> None:
    """Turn on the platform's batch-invariant linears, or fail with one line saying why not."""
    if not packed_linear.enabled():
        raise RuntimeError(
            f"--enable-deterministic-inference on the CPU platform needs its packed linears: unset "
            f"{packed_linear.ENV}=0 (F.linear's per-row result depends on the number of rows)"
        )
    packed_linear.set_batch_invariant(True)
    fewest, most = packed_linear.INVARIANT_ROWS
    logger.info(
        "sglang_echo CPU platform: batch-invariant mode (packed linears in calls of %d-%d rows, %s chunked attention)",
        fewest,
        most,
        BACKEND_NAME,
    )


def _runner_batch_invariant_mode(original: Callable[..., Any], runner: Any) -> Any:
    """AROUND ``ModelRunner.maybe_enable_batch_invariant_mode``: on a CPU runner, the platform's
    mode instead of sglang's Triton aten overrides (which need an accelerator)."""
    if str(getattr(runner, "device", "")) != "cpu" or not enabled():
        return original(runner)
    enable_batch_invariant_ops()
    unpacked = packed_linear.unsupported_dtypes()
    if unpacked:
        logger.warning(
            "batch-invariant mode: oneDNN cannot pack %s weights on this CPU; those linears "
            "run F.linear, whose rows depend on the batch",
            unpacked,
        )
    return None


def register(hooks: Any, around: Any) -> None:
    """Let sglang accept ``echo_torch`` with ``--enable-deterministic-inference`` (keeping the radix
    cache: a prefix-cached extend computes each query as a full prefill does) and hook the runner."""
    from sglang.srt.arg_groups.choices import (
        DETERMINISTIC_ATTENTION_BACKEND_CHOICES,
        RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND,
        add_deterministic_attention_backend_choices,
        add_radix_supported_deterministic_attention_backend_choices,
    )

    if BACKEND_NAME not in DETERMINISTIC_ATTENTION_BACKEND_CHOICES:
        add_deterministic_attention_backend_choices([BACKEND_NAME])
    if BACKEND_NAME not in RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND:
        add_radix_supported_deterministic_attention_backend_choices([BACKEND_NAME])
    hooks.register(RUNNER_HOOK, _runner_batch_invariant_mode, around)
