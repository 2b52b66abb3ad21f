"""A CPU engine forks sglang's children (platform.fork_children); SGLANG_ECHO_SPAWN keeps spawn.
Every real-server test runs with it; these check the switch and the order of the two settings."""

from __future__ import annotations

import multiprocessing

from sglang_echo.integration.compat import HOOKS
from sglang_echo.platform import fork_children


class _Hooks:
    def __init__(self) -> None:
        self.registered: list[tuple] = []

    def register(self, target, fn, kind) -> None:
        self.registered.append((target, fn, kind))


def test_children_are_forked_unless_spawn_is_asked_for(monkeypatch):
    monkeypatch.delenv(fork_children.ENV, raising=False)
    hooks = _Hooks()
    fork_children.register(hooks, "around")
    assert hooks.registered == [(fork_children.SET_ENVS, fork_children._fork_after_set_envs, "around")]
    monkeypatch.setenv(fork_children.ENV, "1")
    hooks = _Hooks()
    fork_children.register(hooks, "around")
    assert hooks.registered == []


def test_fork_is_set_after_sglangs_own_settings(monkeypatch):
    methods = []
    monkeypatch.setattr(multiprocessing, "set_start_method", lambda method, force=False: methods.append(method))

    def set_envs_and_config(server_args):  # sglang's: ends with set_start_method("spawn")
        multiprocessing.set_start_method("spawn", force=True)
        return server_args

    assert fork_children._fork_after_set_envs(set_envs_and_config, "args") == "args"
    assert methods == ["spawn", "fork"]


def test_the_hooked_function_is_in_the_compat_table():
    module, attr = fork_children.SET_ENVS.rsplit(".", 1)
    assert any(h.module == module and h.attr == attr for h in HOOKS)
