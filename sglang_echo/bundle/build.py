"""Build the bundle: resolve, fetch, slim sglang, write ``echo-bundle.tar.xz`` and its manifest.

Layout of the archive (one folder, ``echo-bundle/``): ``wheels/*.whl`` (the third-party runtime:
sglang-echo travels as the repository), ``build/*.whl`` (the project's build backend, used by the
host's ``pip install -e .`` and never installed), ``manifest.json`` and ``install.py``. Every wheel
is stored uncompressed (sglang's slimmed), so the manifest gives both its sha256 and
``source_sha256``, that of the index's file. ``OUT/manifest.json`` beside the archive is the same
manifest plus the archive's size and sha256. Nothing is written to ``OUT`` unless the whole build
succeeds and the archive fits ``max_mib``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from sglang_echo.bundle import BundleError
from sglang_echo.bundle.fetch import PipFetcher
from sglang_echo.bundle.host import HostPackages
from sglang_echo.bundle.needs import SGLANG, SGLANG_VERSION, BuildNeeds, Needs
from sglang_echo.bundle.resolve import Resolution, resolve
from sglang_echo.bundle.slim import SGLANG_RULES, SlimReport, slim_wheel
from sglang_echo.bundle.target import Target
from sglang_echo.bundle.wheels import store_wheel

ARCHIVE = "echo-bundle.tar.xz"
TOP = "echo-bundle"
INSTALL_SCRIPT = Path(__file__).resolve().parent / "host_install.py"
SCHEMA = 1


@dataclass(frozen=True)
class BundleSpec:
    target: Target
    host: HostPackages
    needs: Needs
    build: BuildNeeds
    out: Path
    find_links: Optional[Path] = None
    max_mib: float = 30.0


@dataclass(frozen=True)
class Built:
    archive: Path
    manifest: dict


def install_line(archive: str) -> str:
    """The host's one line, run from the repository's root (the repository travels with the bundle):
    unpack, install the wheels, build sglang-echo editable with the bundle's build backend (pip's
    build isolation, offline), write the platform's ``.pth``. ``--no-deps`` everywhere: pip
    installs nothing but what is named."""
    return (
        f"tar -xJf {archive} -C /tmp && python3 /tmp/{TOP}/install.py && "
        f"python3 -m pip install -q --no-deps --no-index --find-links /tmp/{TOP}/build -e . && "
        "python3 -m sglang_echo.platform.install"
    )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _ships_pth(path: Path) -> bool:
    with zipfile.ZipFile(path) as zf:
        return any("/" not in n and n.endswith(".pth") for n in zf.namelist())


def _stage(res: Resolution, folder: Path) -> tuple[dict[str, Path], Optional[SlimReport]]:
    """Every carried wheel into ``folder``, stored uncompressed; sglang's slimmed."""
    folder.mkdir(parents=True)
    files, slim = {}, None
    for wheel, _ in res.carried:
        dest = folder / wheel.path.name
        if wheel.name == SGLANG:
            slim = slim_wheel(wheel.path, dest, SGLANG_RULES)
        else:
            store_wheel(wheel.path, dest)
        files[wheel.name] = dest
    return files, slim


def _rows(res: Resolution, files: dict[str, Path]) -> list[dict]:
    return [
        {
            "file": files[w.name].name,
            "name": w.name,
            "version": w.version,
            "size": files[w.name].stat().st_size,
            "sha256": _sha256(files[w.name]),
            "source_sha256": _sha256(w.path),
            "pth": _ships_pth(files[w.name]),
            "why": want.why,
        }
        for w, want in res.carried
    ]


def _manifest(
    spec: BundleSpec,
    res: Resolution,
    build: Resolution,
    files: dict[str, Path],
    build_files: dict[str, Path],
    slim: SlimReport,
    archive: str,
) -> dict:
    return {
        "schema": SCHEMA,
        "built_by": "echo-bundle",
        "target": {"python": spec.target.python, "implementation": "cp", "platforms": list(spec.target.platforms)},
        "sglang": SGLANG_VERSION,
        "host_packages": spec.host.source,
        "note": "third-party wheels only: sglang-echo installs from its repository (pip install --no-deps -e .), "
        "built with build_wheels (never installed into the environment)",
        "install": install_line(archive),
        "wheels": _rows(res, files),
        "build_wheels": _rows(build, build_files),
        "unpacked_bytes": sum(p.stat().st_size for p in (*files.values(), *build_files.values())),
        "slimmed": {
            "wheel": slim.wheel,
            "removed_files": slim.removed_files,
            "removed_bytes": slim.removed_bytes,
            "rules": [{"pattern": r.pattern, "files": n, "why": r.why} for r, n in slim.per_rule],
        },
        "host": [
            {"name": h.name, "wanted": h.specifier, "host_version": h.version, "status": h.status, "why": list(h.why)}
            for h in res.host
        ],
        "dropped": [{"requirement": d.requirement, "why": d.why} for d in res.dropped],
    }


def _anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """No builder's user or times in the archive: the same wheels give the same bytes."""
    info.uid = info.gid = info.mtime = 0
    info.uname = info.gname = ""
    return info


def _write_archive(stage: Path, dest: Path) -> None:
    with tarfile.open(dest, "w:xz", preset=9) as tar:
        tar.add(stage, arcname=TOP, filter=_anonymous)


def build_bundle(spec: BundleSpec, archive_display: Optional[str] = None) -> Built:
    """Resolve and fetch into a temporary folder, then move the archive and manifest into ``spec.out``."""
    with tempfile.TemporaryDirectory(prefix="echo-bundle-") as tmp:
        work = Path(tmp)
        fetch = PipFetcher(spec.target, work / "download", spec.find_links)
        res = resolve(spec.needs, spec.host, spec.target, fetch)
        build = resolve(spec.build, HostPackages("an isolated build environment", {}), spec.target, fetch)
        files, slim = _stage(res, work / TOP / "wheels")
        build_files, _ = _stage(build, work / TOP / "build")
        if slim is None:
            raise BundleError(f"{SGLANG} {SGLANG_VERSION} is not among the carried wheels (is it on the host list?)")
        shown = archive_display or str(spec.out / ARCHIVE)
        manifest = _manifest(spec, res, build, files, build_files, slim, shown)
        (work / TOP / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        shutil.copy2(INSTALL_SCRIPT, work / TOP / "install.py")
        archive = work / ARCHIVE
        _write_archive(work / TOP, archive)
        size = archive.stat().st_size
        if size > spec.max_mib * 2**20:
            raise BundleError(
                f"the bundle is {size / 2**20:.1f} MiB ({size} bytes), over --max-mib "
                f"{spec.max_mib:g}; nothing written (largest wheels: {_largest(manifest)})"
            )
        manifest["archive"] = {"file": ARCHIVE, "bytes": size, "sha256": _sha256(archive)}
        spec.out.mkdir(parents=True, exist_ok=True)
        shutil.move(archive, spec.out / ARCHIVE)
        (spec.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return Built(spec.out / ARCHIVE, manifest)


def _largest(manifest: dict) -> str:
    top = sorted(manifest["wheels"], key=lambda w: -w["size"])[:3]
    return ", ".join(f"{w['name']} {w['size'] / 2**20:.1f} MiB" for w in top)
