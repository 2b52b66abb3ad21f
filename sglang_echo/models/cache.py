"""Where prepared artefacts live, and how they are written safely.

Everything here is about the filesystem only (no torch), so it can be imported cheaply by the
launcher and by tests.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sglang_echo import env as echo_env

STAMP_NAME = ".sglang_echo_prepared.json"


def cache_root() -> Path:
    """Root of the sglang-echo cache; `SGLANG_ECHO_CACHE` overrides `~/.cache/sglang-echo`."""
    env = echo_env.get("SGLANG_ECHO_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "sglang-echo"


def models_dir() -> Path:
    return cache_root() / "models"


def read_stamp(path: Path) -> dict[str, Any] | None:
    """The stamp of a finished artefact dir, or None if the dir is missing/partial/corrupt."""
    try:
        return json.loads((path / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return None


def is_fresh(path: Path, fingerprint: str) -> bool:
    stamp = read_stamp(path)
    return stamp is not None and stamp.get("fingerprint") == fingerprint


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Exclusive inter-process lock keyed on an artefact path.

    Why: tests (and several engineers) may prepare the same model concurrently; without a lock
    both would spend the ~30 s conversion and race on the final rename.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.parent / f".{path.name}.lock"
    with open(lock_path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def atomic_dir(final: Path, stamp: dict[str, Any]) -> Iterator[Path]:
    """Yield a temp dir next to `final`; on success write the stamp and rename it into place.

    The rename is atomic on one filesystem, so readers see either the old complete dir or the
    new complete dir, never a half-written one. On error the temp dir is removed.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        (tmp / STAMP_NAME).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
        # mkdtemp makes a 0700 dir; a shared cache must be readable by other users/processes.
        tmp.chmod(0o755)
        for f in tmp.rglob("*"):
            f.chmod(0o755 if f.is_dir() else 0o644)
        old: Path | None = None
        if final.exists():
            # Move the stale dir aside first: rename() cannot replace a non-empty directory.
            old = final.parent / f".{final.name}.old-{os.getpid()}"
            os.replace(final, old)
        os.replace(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
