"""``echo-bundle``: sglang 0.5.23's runtime as one tar.xz of wheels for a GPU host without network.

    echo-bundle --out .bundle                                  # for the lent nvidia-h200 image
    echo-bundle --python 3.12 --platform manylinux_2_39_x86_64 --host-packages host.json --out DIR
    echo-bundle --find-links WHEELS --out DIR                  # offline, from a folder of wheels

Prints the bundle's size, what the host keeps at other versions than sglang asks for, and the
host's one-line install. Exit 2: a bad flag (nothing written); exit 1: the build failed (a wheel
missing, the bundle over --max-mib; nothing written). See sglang_echo/bundle/README.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from sglang_echo.bundle import BundleError
from sglang_echo.bundle.build import ARCHIVE, Built, BundleSpec, build_bundle, install_line
from sglang_echo.bundle.host import DEFAULT_HOST, load_host_packages
from sglang_echo.bundle.needs import DEFAULT_RUNTIME, REPO_ROOT, load_build_needs, load_needs
from sglang_echo.bundle.target import Target
from sglang_echo.cli_args import CommandError, Parser, run

DEFAULT_PLATFORM = "manylinux_2_39_x86_64"


def _parser() -> Parser:
    ap = Parser(prog="echo-bundle", description=__doc__.splitlines()[0])
    ap.add_argument("--python", default="3.12", help="the host's CPython version")
    ap.add_argument(
        "--platform",
        action="append",
        default=None,
        help=f"the host's wheel platform tag, repeatable; manylinux_2_N_arch means glibc 2.N and "
        f"takes every older manylinux tag too (default: {DEFAULT_PLATFORM})",
    )
    ap.add_argument(
        "--host-packages",
        type=Path,
        default=DEFAULT_HOST,
        help="what the host has: `python3 -m pip list --format=json` output from the host, or "
        "`name[==version]` lines (default: the lent nvidia-h200 image's list)",
    )
    ap.add_argument(
        "--runtime",
        type=Path,
        default=DEFAULT_RUNTIME,
        help="the packages sglang needs on this path, pinned (default: requirements-sglang.txt)",
    )
    ap.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="REQ",
        help="another package to carry with its dependencies, repeatable (e.g. one the GPU path imports)",
    )
    ap.add_argument(
        "--constraint",
        type=Path,
        default=None,
        help="pins for carried packages, e.g. `.venv/bin/pip freeze` for the versions CI runs",
    )
    ap.add_argument(
        "--project",
        type=Path,
        default=REPO_ROOT,
        help="the sglang-echo checkout whose [build-system] requires are carried (default: this one)",
    )
    ap.add_argument(
        "--find-links",
        type=Path,
        default=None,
        help="take wheels only from this folder (no index, no pip configuration)",
    )
    ap.add_argument("--out", type=Path, default=Path(".bundle"), help=f"writes OUT/{ARCHIVE} and OUT/manifest.json")
    ap.add_argument("--max-mib", type=float, default=30.0, help="fail if the archive is larger")
    return ap


def _spec(args: argparse.Namespace) -> BundleSpec:
    """Every flag checked before anything is fetched or written."""
    target = Target.parse(args.python, args.platform or [DEFAULT_PLATFORM])
    if args.find_links is not None and not args.find_links.is_dir():
        raise BundleError(f"--find-links {args.find_links}: no such folder")
    if args.out.exists() and not args.out.is_dir():
        raise BundleError(f"--out {args.out}: exists and is not a folder")
    if not args.max_mib > 0:
        raise BundleError(f"--max-mib {args.max_mib:g}: must be > 0")
    needs = load_needs(args.runtime, args.extra, args.constraint)
    host = load_host_packages(args.host_packages)
    build = load_build_needs(args.project)
    return BundleSpec(target, host, needs, build, args.out, args.find_links, args.max_mib)


def _report(built: Built, shown: str) -> str:
    m = built.manifest
    mismatched = [h for h in m["host"] if h["status"] == "mismatch"]
    missing = [h for h in m["host"] if h["status"] == "missing"]
    mib = {
        k: f"{v / 2**20:.1f} MiB"
        for k, v in (
            ("archive", m["archive"]["bytes"]),
            ("unpacked", m["unpacked_bytes"]),
            ("slimmed", m["slimmed"]["removed_bytes"]),
        )
    }
    lines = [
        f"echo-bundle: {len(m['wheels'])} wheels + {len(m['build_wheels'])} to build sglang-echo -> {shown}, "
        f"{mib['archive']} ({mib['unpacked']} unpacked; sglang slimmed by {mib['slimmed']}); "
        f"manifest {Path(shown).parent / 'manifest.json'}"
    ]
    if mismatched:
        lines.append(
            "host keeps other versions than asked: "
            + ", ".join(f"{h['name']} {h['host_version']} ({h['wanted']})" for h in mismatched)
        )
    if missing:
        lines.append("WARNING: not on the host and never bundled: " + ", ".join(h["name"] for h in missing))
    lines += ["install on the host, from the repository's root:", "  " + install_line(shown)]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    try:
        spec = _spec(args)
    except BundleError as e:
        ap.error(str(e))
    return run(ap.prog, lambda: _build(args, spec), args.debug)


def _build(args: argparse.Namespace, spec: BundleSpec) -> None:
    shown = str(args.out / ARCHIVE)
    try:
        built = build_bundle(spec, archive_display=shown)
    except BundleError as e:
        raise CommandError(str(e)) from None
    print(_report(built, shown))


if __name__ == "__main__":
    sys.exit(main())
