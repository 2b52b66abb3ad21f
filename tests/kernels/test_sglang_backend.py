"""Registering the backend makes its name known to sglang 0.5.23's registry and CLI choices."""

from __future__ import annotations


def test_registration_makes_the_name_known():
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    from sglang_echo.kernels.sglang_backend import BACKEND_NAME, create_backend, register_sglang_backend

    assert register_sglang_backend() == BACKEND_NAME
    assert register_sglang_backend() == BACKEND_NAME  # idempotent
    assert ATTENTION_BACKENDS[BACKEND_NAME] is create_backend
    assert BACKEND_NAME in ATTENTION_BACKEND_CHOICES
