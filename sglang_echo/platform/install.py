"""Install / remove the one-line `.pth` that makes `sgl_kernel` importable without sglang-kernel.

Usage:  python -m sglang_echo.platform.install [--uninstall]

Why a .pth: scheduler/detokenizer subprocesses are started with multiprocessing "spawn"; the
child imports sglang modules that do `from sgl_kernel import ..._cpu` while unpickling its
target, before sglang's `load_plugins()` runs in that process. A .pth line is the standard
Python hook that runs at every interpreter start, before any of that. The line imports our
finder (stdlib imports only; about 2 ms) and appends it to `sys.meta_path`; the finder
decides nothing until `sgl_kernel` itself is imported (kernel_finder.platform_mode: CPU engine,
CUDA without sglang-kernel, or nothing). If sglang_echo is gone, the line does nothing.
"""

from __future__ import annotations

import argparse
import sysconfig
from pathlib import Path

PTH_NAME = "sglang_echo_platform.pth"
PTH_LINE = (
    "import importlib.util; importlib.util.find_spec('sglang_echo') and "
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
