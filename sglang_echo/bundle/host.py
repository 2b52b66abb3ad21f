"""What the host already has: its Python packages, and their versions where known.

Two formats, told apart by the first character:

* ``python3 -m pip list --format=json`` run on the host (a JSON list of ``{"name", "version"}``):
  the exact way to (re)generate a host's file;
* a text list, one package a line, ``name`` or ``name==version``, ``#`` comments: what ships in
  ``hosts/`` when only a description of the host's image is at hand.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from sglang_echo.bundle import BundleError

HOSTS_DIR = Path(__file__).resolve().parent / "hosts"
DEFAULT_HOST = HOSTS_DIR / "nvidia-h200.txt"


@dataclass(frozen=True)
class HostPackages:
    """Canonical project name -> version (None where the source gave no version)."""

    source: str
    versions: dict[str, Optional[str]]

    def has(self, name: str) -> bool:
        return canonicalize_name(name) in self.versions

    def version(self, name: str) -> Optional[str]:
        return self.versions.get(canonicalize_name(name))


def _from_pip_json(text: str, where: str) -> dict[str, Optional[str]]:
    try:
        rows = json.loads(text)
        return {canonicalize_name(r["name"]): r.get("version") for r in rows}
    except (ValueError, TypeError, KeyError) as e:
        raise BundleError(f"--host-packages {where}: not `pip list --format=json` output ({e})") from None


def _from_text(text: str, where: str) -> dict[str, Optional[str]]:
    out: dict[str, Optional[str]] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement:
            raise BundleError(f"--host-packages {where}:{lineno}: {line!r} is not `name` or `name==version`") from None
        pins = [s.version for s in req.specifier if s.operator == "=="]
        if len(req.specifier) > len(pins):
            raise BundleError(f"--host-packages {where}:{lineno}: {line!r}: only `==version` is allowed")
        out[canonicalize_name(req.name)] = pins[0] if pins else None
    return out


def load_host_packages(path: Path) -> HostPackages:
    if not path.is_file():
        raise BundleError(f"--host-packages {path}: no such file")
    text = path.read_text()
    parse = _from_pip_json if text.lstrip().startswith("[") else _from_text
    versions = parse(text, str(path))
    if not versions:
        raise BundleError(f"--host-packages {path}: lists no packages")
    return HostPackages(str(path), versions)
