"""`echo-bench`: one entry point for the project's benchmarks.

Each subcommand lives in its own module and parses its own options (``echo-bench SUBCOMMAND
--help``); the module is imported only when its subcommand runs, so ``echo-bench --help`` and a
bad subcommand name answer without importing torch."""

from __future__ import annotations

import argparse
import importlib

from ..cli_args import Parser

# name -> (module, one line for the listing)
SUBCOMMANDS = {
    "scheduler": ("sglang_echo.bench.scheduler", "the control plane's cost per speculative step (synthetic batch)"),
    "serve": ("sglang_echo.bench.serve", "tokens/s, latency and accepted length of sglang servers, side by side"),
    "acceptance": ("sglang_echo.bench.acceptance", "acceptance (MAT) and step cost of tree policies, offline"),
    "figures": ("sglang_echo.bench.figures", "the plots of an `echo-bench serve` run, from its serve.json"),
    "graphs": ("sglang_echo.bench.graphs", "the GPU server's control plane, eager against CUDA graphs"),
}


def parser() -> Parser:
    listing = "\n".join(f"  {name:<11} {line}" for name, (_, line) in SUBCOMMANDS.items())
    ap = Parser(
        prog="echo-bench",
        debug_flag=False,
        description=__doc__.splitlines()[0],
        epilog=f"subcommands:\n{listing}\n\n`echo-bench SUBCOMMAND --help` lists its options.",
    )
    ap.add_argument(
        "command", choices=tuple(SUBCOMMANDS), metavar="SUBCOMMAND", help=f"one of {', '.join(SUBCOMMANDS)}"
    )
    ap.add_argument("options", nargs=argparse.REMAINDER, help="the subcommand's options")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    return module.main(args.options) or 0


if __name__ == "__main__":
    raise SystemExit(main())
