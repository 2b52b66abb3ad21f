"""One local wheel set and one bundle built from it (offline: ``--find-links``), shared by the suite."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from .wheelset import binary_tag, build_wheelset, write_inputs


@dataclass(frozen=True)
class BuiltBundle:
    out: Path
    stdout: str
    manifest: dict
    unpacked: Path  # the archive extracted: unpacked / "echo-bundle" / ...


def bundle_args(inputs: dict[str, Path], wheels: Path, out: Path) -> list[str]:
    tag = binary_tag()
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return [
        "--python",
        python,
        "--platform",
        tag.platform,
        "--host-packages",
        str(inputs["host"]),
        "--runtime",
        str(inputs["runtime"]),
        "--project",
        str(inputs["project"]),
        "--find-links",
        str(wheels),
        "--out",
        str(out),
    ]


def run_cli(args: list[str]) -> subprocess.CompletedProcess:
    """``echo-bundle`` as a user runs it: its own process, its exit code, its two streams."""
    return subprocess.run([sys.executable, "-m", "sglang_echo.bundle.cli", *args], capture_output=True, text=True)


@pytest.fixture(scope="session")
def wheelset(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("bundle-inputs")
    return build_wheelset(root / "wheels"), write_inputs(root)


@pytest.fixture(scope="session")
def built(wheelset, tmp_path_factory) -> BuiltBundle:
    wheels, inputs = wheelset
    out = tmp_path_factory.mktemp("bundle-out") / "bundle"
    proc = run_cli(bundle_args(inputs, wheels, out))
    assert proc.returncode == 0, proc.stderr
    unpacked = tmp_path_factory.mktemp("bundle-unpacked")
    with tarfile.open(out / "echo-bundle.tar.xz") as tar:
        tar.extractall(unpacked, filter="data")
    return BuiltBundle(out, proc.stdout, json.loads((out / "manifest.json").read_text()), unpacked)
