"""``benchmarks/gpu/travel.sh``: what goes to a lent GPU is measured after the heads leave the tree.

The script runs in a scratch git repository laid out like this one (a tracked head's weights, a
carried ``.bundle``), so the real checkout's heads are never moved by a test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu" / "travel.sh"
MIB = 2**20


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with the script, 1 MiB of tracked code and a 5 MiB tracked head."""
    (tmp_path / "benchmarks" / "gpu").mkdir(parents=True)
    shutil.copy(SCRIPT, tmp_path / "benchmarks" / "gpu" / "travel.sh")
    head = tmp_path / "sglang_echo" / "assets" / "head"
    head.mkdir(parents=True)
    (head / "model.safetensors").write_bytes(b"w" * (5 * MIB))
    (head / "config.json").write_text("{}")
    (tmp_path / "code.py").write_bytes(b"#" * MIB)
    (tmp_path / ".gitignore").write_text(".bundle/\n.gpu-stash/\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "tree")
    return tmp_path


def _travel(repo: Path, what: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "benchmarks/gpu/travel.sh", what], cwd=repo, capture_output=True, text=True, env=dict(os.environ)
    )


def test_out_counts_what_travels_without_the_heads_and_back_restores_them(repo: Path):
    (repo / ".bundle").mkdir()
    (repo / ".bundle" / "echo-bundle.tar.xz").write_bytes(b"b" * (2 * MIB))
    weights = repo / "sglang_echo" / "assets" / "head" / "model.safetensors"

    out = _travel(repo, "out")
    assert out.returncode == 0, out.stderr
    assert not weights.exists() and (repo / ".gpu-stash" / "sglang_echo/assets/head/model.safetensors").exists()
    # The tree without the 5 MiB head (1 MiB of code and a few small files), the bundle carried.
    assert "travels: 3.0 MiB (tree 1.0, untracked 0.0, carried .bundle/.sim 2.0)" in out.stdout

    back = _travel(repo, "back")
    assert back.returncode == 0, back.stderr
    assert weights.stat().st_size == 5 * MIB and not (repo / ".gpu-stash").exists()


def test_out_refuses_a_tree_over_the_limit(repo: Path):
    (repo / ".bundle").mkdir()
    with open(repo / ".bundle" / "echo-bundle.tar.xz", "wb") as f:
        f.truncate(70 * MIB)  # sparse: its size counts, not its blocks
    out = _travel(repo, "out")
    assert out.returncode == 1
    assert "over the limit" in out.stderr
