"""Wheel files: read a wheel's name and metadata, and write a valid wheel from members.

``write_wheel`` guarantees the wheel spec's (PEP 427) integrity rule: RECORD lists every member
with its sha256 (urlsafe base64, unpadded) and size, and itself without a hash, so pip installs the
result and can uninstall it again.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile
from dataclasses import dataclass
from email.parser import BytesParser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from sglang_echo.bundle import BundleError


@dataclass(frozen=True)
class WheelInfo:
    """One wheel on disk: its project (canonical name), version and declared dependencies."""

    path: Path
    name: str
    version: str
    requires: tuple[Requirement, ...]


@dataclass(frozen=True)
class Member:
    """One file inside a wheel: its archive name, bytes and Unix mode (0 keeps zip's default)."""

    name: str
    data: bytes
    mode: int = 0


def project_of(path: Path) -> str:
    """The canonical project name in a wheel's file name (``Foo_Bar-1.0-...whl`` -> ``foo-bar``)."""
    try:
        return canonicalize_name(parse_wheel_filename(path.name)[0])
    except InvalidWheelFilename as e:
        raise BundleError(f"{path.name}: not a wheel file name ({e})") from None


def dist_info_dir(names: list[str]) -> str:
    """The single top-level ``*.dist-info`` folder among a wheel's member names."""
    found = {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
    if len(found) != 1:
        raise BundleError(f"a wheel must hold exactly one .dist-info folder, found {sorted(found)}")
    return found.pop()


def read_wheel(path: Path) -> WheelInfo:
    """Name, version and Requires-Dist from the wheel's METADATA (not from its file name)."""
    try:
        with zipfile.ZipFile(path) as zf:
            meta = BytesParser().parsebytes(zf.read(f"{dist_info_dir(zf.namelist())}/METADATA"))
    except (zipfile.BadZipFile, KeyError) as e:
        raise BundleError(f"{path.name}: not a readable wheel ({e})") from None
    try:
        requires = tuple(Requirement(r) for r in meta.get_all("Requires-Dist") or ())
    except InvalidRequirement as e:
        raise BundleError(f"{path.name}: bad Requires-Dist ({e})") from None
    return WheelInfo(path, canonicalize_name(meta["Name"]), meta["Version"], requires)


def read_members(path: Path) -> list[Member]:
    """Every file of a wheel, in archive order, with its Unix mode."""
    with zipfile.ZipFile(path) as zf:
        return [Member(i.filename, zf.read(i), i.external_attr >> 16) for i in zf.infolist() if not i.is_dir()]


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _write_zip(dest: Path, members: list[Member], compress: bool) -> Path:
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(dest, "w", compression=method) as zf:
        for m in members:
            info = zipfile.ZipInfo(m.name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (m.mode or 0o644) << 16
            info.compress_type = method
            zf.writestr(info, m.data)
    return dest


def write_wheel(dest: Path, members: list[Member], compress: bool = True) -> Path:
    """Write ``members`` as a wheel at ``dest`` with a fresh RECORD (any RECORD or signature among
    ``members`` is replaced)."""
    info_dir = dist_info_dir([m.name for m in members])
    stale = {f"{info_dir}/RECORD", f"{info_dir}/RECORD.jws", f"{info_dir}/RECORD.p7s"}
    kept = [m for m in members if m.name not in stale]
    rows = io.StringIO()
    writer = csv.writer(rows, lineterminator="\n")
    for m in kept:
        writer.writerow([m.name, _record_hash(m.data), len(m.data)])
    writer.writerow([f"{info_dir}/RECORD", "", ""])
    return _write_zip(dest, [*kept, Member(f"{info_dir}/RECORD", rows.getvalue().encode(), 0o644)], compress)


def store_wheel(src: Path, dest: Path) -> Path:
    """``src`` with the same members (RECORD untouched, so still valid) stored uncompressed: a
    wheel that travels inside a tar.xz compresses as one stream with its neighbours, about a
    quarter smaller than deflated file by file."""
    return _write_zip(dest, read_members(src), compress=False)
