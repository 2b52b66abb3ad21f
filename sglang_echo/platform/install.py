"""Install / remove the one-line `.pth` that makes `sgl_kernel` importable on the CPU engine.

Usage:  python -m sglang_echo.platform.install [--uninstall]

Why a .pth: scheduler/detokenizer subprocesses are started with multiprocessing "spawn"; the
child imports sglang modules that do `from sgl_kernel import ..._cpu` while unpickling its
target, before sglang's `load_plugins()` runs in that process. A .pth line is the standard
Python hook that runs at every interpreter start, before any of that. The line only imports
our (dependency-free) finder when SGLANG_USE_CPU_ENGINE=1, so other processes pay nothing.
"""

from __future__ import annotations

import argparse
import sysconfig
from pathlib import Path

PTH_NAME = "sglang_echo_platform.pth"
PTH_LINE = (
    "import os; os.environ.get('SGLANG_USE_CPU_ENGINE') == '1' and "
    "__import__('sglang_echo.platform.kernel_finder', fromlist=['install']).install()\n"
)


def pth_path() -> Path:
    return Path(sysconfig.get_paths()["purelib"]) / PTH_NAME


def install() -> Path:
    path = pth_path()
    path.write_text(PTH_LINE)
    return path


def uninstall() -> None:
    pth_path().unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uninstall", action="store_true")
    args = parser.parse_args()
    if args.uninstall:
        uninstall()
        print(f"removed {pth_path()}")
    else:
        print(f"wrote {install()}")


if __name__ == "__main__":
    main()
