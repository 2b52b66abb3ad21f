"""``python -m sglang_echo.training.pool_cli --out DIR [--per-kind N]``: the prompt pool's dev
split, one ``DIR/<kind>_dev.jsonl`` per kind (:func:`~.prompt_pool.write_dev_split`), in the
format of `prompts/`, for ``SGLANG_ECHO_PROMPTS`` or a script to evaluate a head per kind."""

from __future__ import annotations

from sglang_echo.cli_args import Parser, out_dir, positive_int, run

from .prompt_pool import write_dev_split


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="python -m sglang_echo.training.pool_cli", description="Write the pool's dev split per kind.")
    ap.add_argument("--out", type=out_dir, required=True, help="folder for <kind>_dev.jsonl")
    ap.add_argument("--per-kind", type=positive_int, default=64, help="dev prompts of each kind")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    return run(ap.prog, lambda: print("\n".join(map(str, write_dev_split(a.out, a.per_kind, a.seed)))), a.debug)


if __name__ == "__main__":
    raise SystemExit(main())
