"""`echo-bench`: one entry point for the project's benchmarks."""

from __future__ import annotations

import sys

SUBCOMMANDS = {
    "scheduler": "sglang_echo.bench.scheduler",
    "serve": "sglang_echo.bench.serve",
    "acceptance": "sglang_echo.bench.acceptance",
    "figures": "sglang_echo.bench.figures",
    "graphs": "sglang_echo.bench.graphs",
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in SUBCOMMANDS:
        sys.exit(f"usage: echo-bench {{{','.join(SUBCOMMANDS)}}} [options]")
    module = __import__(SUBCOMMANDS[argv[0]], fromlist=["main"])
    module.main(argv[1:])


if __name__ == "__main__":
    main()
