"""ECHO registers through sglang's plugin loader, idempotently, against a checked hook table
(sglang's argument parser with ECHO: ``test_server_args``)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def loaded():
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.speculative.spec_registry import get_spec

    return get_spec("ECHO")


def test_registered_through_load_plugins(loaded):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_echo.integration.spec import EchoSpecAlgo

    assert isinstance(loaded, EchoSpecAlgo)
    algo = SpeculativeAlgorithm.from_string("echo")
    assert algo is loaded and algo.name == "ECHO" and algo.supports_overlap
    assert algo.is_eagle() and algo.is_eagle3() and algo.need_topk() and algo.carries_draft_hidden_states()
    assert not algo.is_ngram() and not algo.is_standalone() and algo.get_platform_worker_cls() is None


def test_spec_class_has_every_enum_method(loaded):
    """Memo 1.2: CustomSpecAlgo lacks methods sglang calls unconditionally; ECHO must not."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    enum_methods = {n for n, v in vars(SpeculativeAlgorithm).items() if callable(v) and not n.startswith("_")}
    missing = enum_methods - set(dir(type(loaded))) - {"from_string", "register"}
    assert not missing, missing


def test_idempotent_reregistration(loaded):
    from sglang.srt.speculative.spec_registry import get_spec

    from sglang_echo import plugin

    plugin.register()
    plugin.register()
    assert get_spec("ECHO") is loaded


def test_hook_table_matches_installed_sglang():
    from sglang_echo.integration.compat import HOOKS, check_hooks

    assert check_hooks() == []
    assert {h.phase for h in HOOKS} == {"register", "worker"}


def test_registration_refuses_a_different_sglang(loaded, monkeypatch):
    from sglang.srt.speculative import spec_registry

    from sglang_echo import plugin
    from sglang_echo.integration import compat

    bad = compat.Hook(
        "sglang.srt.speculative.spec_info",
        "SpeculativeAlgorithm.register",
        ("name", "supports_overlap", "renamed_arg"),
        "test",
        "register",
    )
    monkeypatch.setattr(compat, "HOOKS", compat.HOOKS + (bad,))
    monkeypatch.delitem(spec_registry._REGISTRY, "ECHO")
    with pytest.raises(compat.EchoCompatError) as e:
        plugin.register()
    msg = str(e.value)
    assert "sglang.srt.speculative.spec_info:SpeculativeAlgorithm.register" in msg
    assert "renamed_arg" in msg and "'validate_server_args'" in msg
    assert spec_registry.get_spec("ECHO") is None  # refused: nothing registered
    missing = compat.Hook("sglang.srt.speculative.eagle_worker_common", "no_such_function", None, "test", "register")
    monkeypatch.setattr(compat, "HOOKS", (missing,))
    with pytest.raises(compat.EchoCompatError, match="no_such_function.*missing"):
        plugin.register()
