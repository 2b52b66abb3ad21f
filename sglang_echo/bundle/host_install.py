"""Install an echo-bundle's wheels on a host without network (ships in the bundle as ``install.py``).

    python3 install.py                 # into this interpreter's environment (its site-packages)
    python3 install.py --target DIR    # into DIR; then export PYTHONPATH=DIR

Guarantees: pip runs with ``--no-index --no-deps``, so it installs exactly the bundle's wheels and
never resolves, downloads, upgrades or removes anything else; a wheel whose project this
interpreter already has is skipped (the host's version wins); torch, triton and transformers are
checked unchanged afterwards (exit 1 otherwise). Exit 2: the bundle does not fit this interpreter.

Why the default is the interpreter's own environment: sglang-echo's platform hook is a ``.pth``
file, and Python runs ``.pth`` files only in site directories, not in PYTHONPATH folders such as
``--target``'s. In the default mode the repository's ``pip install --no-deps -e .`` and
``python3 -m sglang_echo.platform.install`` land where every bundle package is. With ``--target``,
that hook still goes into the interpreter's site-packages and works, because PYTHONPATH folders
are on sys.path before site runs ``.pth`` files; any ``.pth`` a bundled wheel ships is not run
(listed in the manifest; the wheels echo-bundle builds for sglang 0.5.23 ship none).

Standard library only: it runs before anything from the bundle is importable.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as metadata
import json
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

GUARDED = ("torch", "triton", "transformers")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed() -> dict[str, str]:
    importlib.invalidate_caches()
    return {_canonical(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}


def _fail(code: int, message: str) -> int:
    print(f"install.py: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Install this echo-bundle's wheels (pip --no-index --no-deps).")
    ap.add_argument("--target", type=Path, default=None, help="install into DIR (then put DIR on PYTHONPATH)")
    args = ap.parse_args(argv)
    here = Path(__file__).resolve().parent
    manifest = json.loads((here / "manifest.json").read_text())
    want, have = manifest["target"]["python"], f"{sys.version_info[0]}.{sys.version_info[1]}"
    if ".".join(want.split(".")[:2]) != have:
        return _fail(2, f"this bundle is for Python {want}; {sys.executable} is Python {have}")
    before = _installed()
    wheels = {w["file"]: w["name"] for w in manifest["wheels"]}
    skipped = sorted(f"{n} {before[n]}" for n in wheels.values() if n in before)
    todo = [str(here / "wheels" / f) for f, n in sorted(wheels.items()) if n not in before]
    where = str(args.target) if args.target else sysconfig.get_paths()["purelib"]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        "--no-index",
        "--no-deps",
        "--no-compile",
        *(["--target", where] if args.target else []),
        *todo,
    ]
    if todo and subprocess.call(cmd) != 0:
        return _fail(1, "pip install failed (its error is above)")
    after = _installed()
    changed = [f"{n} {before.get(n)} -> {after.get(n)}" for n in GUARDED if before.get(n) != after.get(n)]
    if changed:
        return _fail(1, f"the host's {', '.join(changed)} changed; it must stay the host's")
    kept = ", ".join(f"{n} {before[n]}" for n in GUARDED if n in before)
    print(
        f"echo-bundle: installed {len(todo)} wheels into {where}; "
        + (f"kept the host's {kept}" if kept else "this interpreter has no torch, triton or transformers")
        + (f"; skipped (already there): {', '.join(skipped)}" if skipped else "")
    )
    pth = [w["file"] for w in manifest["wheels"] if w.get("pth")]
    if args.target:
        unrun = f" (not run from there: the .pth of {pth})" if pth else ""
        print(f"echo-bundle: now export PYTHONPATH={where}{unrun}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
