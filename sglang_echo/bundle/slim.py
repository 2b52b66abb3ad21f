"""Slim the sglang wheel: drop what the LLM server does not import on the CPU / bare-GPU path.

The repacked wheel keeps sglang's name, version, tags and dist-info (entry points included) and
gets a fresh RECORD (``wheels.write_wheel``), so pip installs and uninstalls it like the original.
It is stored uncompressed, like every wheel in the bundle (``wheels.store_wheel``).
Every rule below was checked against sglang 0.5.23's source: the server path reaches these files
only behind an ImportError guard, an opt-in flag or a fallback (see each ``why``).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from sglang_echo.bundle.wheels import read_members, write_wheel


@dataclass(frozen=True)
class SlimRule:
    """Drop the members whose archive name matches ``pattern`` (fnmatch: ``*`` spans folders)."""

    pattern: str
    why: str


SGLANG_RULES = (
    SlimRule(
        "sglang/multimodal_gen/*",
        "diffusion serving: `sglang generate` and diffusion model paths only; "
        "the LLM server's probes for it (sglang/cli/utils.py) treat an ImportError as 'not diffusion'",
    ),
    SlimRule("sglang/test/*", "sglang's own test kit: the server imports it only under SGLANG_TEST_SCRIPTED_RUNTIME"),
    SlimRule(
        "sglang/*.so",
        "compiled Rust extensions (gRPC server, Rust HTTP server, multimodal transport, "
        "bench client, Rust radix tree): used only when their flags ask for them, and without the "
        "radix-tree extension sglang selects the Python TreeCore",
    ),
)


@dataclass(frozen=True)
class SlimReport:
    wheel: str
    removed_files: int
    removed_bytes: int
    per_rule: tuple[tuple[SlimRule, int], ...]


def slim_wheel(src: Path, dest: Path, rules: tuple[SlimRule, ...] = SGLANG_RULES) -> SlimReport:
    """Write ``src`` minus the members matching ``rules`` to ``dest`` (a valid wheel)."""
    members = read_members(src)
    counts = {rule: 0 for rule in rules}
    kept, removed_bytes = [], 0
    for m in members:
        rule = next((r for r in rules if fnmatch.fnmatchcase(m.name, r.pattern)), None)
        if rule is None:
            kept.append(m)
        else:
            counts[rule] += 1
            removed_bytes += len(m.data)
    write_wheel(dest, kept, compress=False)
    return SlimReport(dest.name, len(members) - len(kept), removed_bytes, tuple(counts.items()))
