"""Download the host's wheels with pip: ``pip download --no-deps --only-binary=:all:`` per round.

Only binary wheels for the target's Python and platform tags are taken (``Target.pip_args``), never
an sdist, and never a dependency: the resolver decides what to fetch. With ``find_links`` pip reads
only that folder (``--no-index``) and ignores every pip configuration file and ``PIP_*`` variable,
so a build from a local folder is hermetic; otherwise the user's pip configuration (index, proxy,
certificates) applies.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from packaging.specifiers import SpecifierSet

from sglang_echo.bundle import BundleError
from sglang_echo.bundle.target import Target
from sglang_echo.bundle.wheels import project_of


def _pip_env(hermetic: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not (hermetic and k.startswith("PIP_"))}
    if hermetic:
        env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _pip_error(stderr: str) -> str:
    """pip's own one-line reason, e.g. ``No matching distribution found for eta<2``."""
    errors = [line.removeprefix("ERROR: ").strip() for line in stderr.splitlines() if line.startswith("ERROR:")]
    missing = [e for e in errors if e.startswith("No matching distribution")]
    return (missing or errors or [stderr.strip().splitlines()[-1] if stderr.strip() else "pip failed"])[-1]


@dataclass
class PipFetcher:
    """Fetch one wheel per requirement into a fresh folder under ``workdir`` per call."""

    target: Target
    workdir: Path
    find_links: Optional[Path] = None
    calls: int = 0

    def __call__(self, wanted: dict[str, SpecifierSet]) -> dict[str, Path]:
        """Canonical project name -> the downloaded wheel, one per entry of ``wanted``."""
        self.calls += 1
        dest = self.workdir / f"round-{self.calls}"
        dest.mkdir(parents=True)
        source = ["--no-index", "--find-links", str(self.find_links)] if self.find_links else []
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "-q",
            *source,
            *self.target.pip_args(),
            "-d",
            str(dest),
            *(f"{name}{spec}" for name, spec in sorted(wanted.items())),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_pip_env(self.find_links is not None))
        if proc.returncode != 0:
            where = self.find_links or "the index"
            raise BundleError(
                f"pip download from {where} for {self.target.abi} {self.target.platforms[0]}: {_pip_error(proc.stderr)}"
            )
        got = {project_of(p): p for p in dest.glob("*.whl")}
        if wanted.keys() - got.keys():
            raise BundleError(f"pip download returned no wheel for {sorted(wanted.keys() - got.keys())}")
        return got
