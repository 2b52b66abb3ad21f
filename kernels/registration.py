"""Make the ``echo_tree_triton`` attention backend known to sglang, cheaply.

Called by the ECHO plugin in every sglang process; the backend module (which imports sglang's
Triton backend and our kernels) is imported only when a server actually selects the backend with
``--attention-backend echo_tree_triton``.
"""

from __future__ import annotations

from typing import Any

BACKEND_NAME = "echo_tree_triton"


def _create_backend(runner: Any) -> Any:
    from .sglang_backend import create_backend

    return create_backend(runner)


def register_sglang_backend() -> str:
    """Add ``echo_tree_triton`` to sglang's backend registry and CLI choices (idempotent)."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend

    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
    if BACKEND_NAME not in ATTENTION_BACKENDS:
        register_attention_backend(BACKEND_NAME)(_create_backend)
    return BACKEND_NAME
