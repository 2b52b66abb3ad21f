"""The ``SGLANG_ECHO_*`` registry (sglang_echo/env.py): every variable the package reads is in it,
and anything else with the prefix is refused at start, named with its likely meaning."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sglang_echo import env

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("sglang_echo", "kernels", "calibration", "loadtests", "benchmarks", "deploy")


def test_every_variable_the_package_names_is_registered():
    named = set()
    for folder in SOURCES:
        for path in (ROOT / folder).rglob("*"):
            if path == ROOT / "sglang_echo/env.py":  # the registry itself (its docstring names a typo)
                continue
            if path.suffix in (".py", ".sh", ".yaml", ".json", ".toml") or path.name in ("Dockerfile", "Makefile"):
                named |= set(re.findall(r"SGLANG_ECHO_[A-Z0-9_]*[A-Z0-9]", path.read_text(errors="ignore")))
    named = {n for n in named if not n.startswith(env.TEST_PREFIX) and n != env.PREFIX.rstrip("_")}
    assert named, "the scan found nothing: the pattern or the folders are wrong"
    assert sorted(named - set(env.VARS)) == []


def test_unknown_variables_are_refused_with_a_suggestion():
    with pytest.raises(env.EnvError, match=r"SGLANG_ECHO_KMAX \(did you mean SGLANG_ECHO_K_MAX\?\)"):
        env.check({"SGLANG_ECHO_KMAX": "5", "SGLANG_ECHO_POLICY": "echo"})
    with pytest.raises(env.EnvError, match=r"unknown environment variable\(s\) SGLANG_ECHO_ZZZ: nothing reads"):
        env.check({"SGLANG_ECHO_ZZZ": "1"})
    env.check({"SGLANG_ECHO_POLICY": "echo", "SGLANG_ECHO_TEST_LOG_DIR": "/tmp", "OTHER": "x"})


def test_reads_go_through_the_registry():
    assert env.get("SGLANG_ECHO_POLICY", "echo", {}) == "echo"
    assert env.get("SGLANG_ECHO_POLICY", "echo", {"SGLANG_ECHO_POLICY": ""}) == "echo"  # empty: unset
    assert env.flag("SGLANG_ECHO_STEP_TIMES", environ={"SGLANG_ECHO_STEP_TIMES": "1"})
    with pytest.raises(KeyError, match="register it there first"):
        env.get("SGLANG_ECHO_NOT_A_SETTING")
