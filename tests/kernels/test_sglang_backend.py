"""The ECHO plugin makes ``echo_tree_triton`` known to sglang 0.5.23's registry and CLI choices."""

from __future__ import annotations


def test_the_plugin_registers_the_backend_lazily():

    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    from sglang_echo import plugin
    from sglang_echo.kernels import registration

    plugin.register()
    plugin.register()  # idempotent
    assert ATTENTION_BACKENDS[registration.BACKEND_NAME] is registration._create_backend
    assert registration.BACKEND_NAME in ATTENTION_BACKEND_CHOICES
    assert registration.register_sglang_backend() == registration.BACKEND_NAME


def test_the_backend_module_imports_and_exposes_its_factory():
    from sglang_echo.kernels.sglang_backend import BACKEND_NAME, EchoTreeVerifyBackend, create_backend

    assert BACKEND_NAME == "echo_tree_triton" and callable(create_backend)
    assert EchoTreeVerifyBackend.forward_extend is not None
