"""The command-line convention every sglang-echo tool follows, and the checks they share.

Guarantees for a command built on :class:`Parser` and run through :func:`run`:

* ``--help`` on every level exits 0 and shows each option's default;
* a bad value, a missing file or folder, an unknown name in a comma list, an option out of range:
  one line ``<prog>: error: ...`` on stderr and exit status 2, raised while the arguments are
  parsed, so before any work starts or any file is written (the type functions below check
  paths and ranges; cross-option checks call ``parser.error`` right after parsing);
* a failure during the work: one line ``<prog>: error: ...`` and exit status 1, with the
  traceback only under ``--debug`` or ``SGLANG_ECHO_DEBUG=1``;
* a renamed option keeps its old spelling as a hidden alias (:func:`alias`) that prints a
  one-line deprecation note and sets the same value.

One spelling per concept across the tools: ``--model`` (the target), ``--draft`` (a head folder),
``--max-new-tokens``, ``--num-prompts`` (prompts in all) and ``--per-set`` (prompts of each
prompt set), ``--out``, ``--device``, ``--dtype``, ``--port``.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

DEBUG_ENV = "SGLANG_ECHO_DEBUG"
DTYPES = ("float32", "bfloat16", "float16")
SERVER_DEVICES = ("cpu", "cuda")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


class CommandError(Exception):
    """A failure during a command's work whose message is meant for the user (exit status 1)."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions as written, and ``(default: X)`` after every option that has a default worth
    printing (not None, not False) unless its help names it already, also after options that
    have no help text."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "%(default)" in text or "(default" in text:  # the help says it already
            return text
        if default is None or default is False or default is argparse.SUPPRESS:
            return text
        if isinstance(default, (list, tuple)) and not default:
            return text
        if not action.option_strings and action.nargs not in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return text
        return f"{text} (default: %(default)s)".strip()

    def _format_action(self, action: argparse.Action) -> str:
        if action.help is not argparse.SUPPRESS and not (action.help or "").strip():
            shown = self._get_help_string(action)
            if shown:
                action = copy.copy(action)
                action.help = shown
        return super()._format_action(action)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that reports a bad argument in one line (exit 2), shows defaults in its
    help, and has ``--debug`` unless ``debug_flag=False`` (a parent whose subcommands have it)."""

    def __init__(self, *args: Any, debug_flag: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self._required_after_aliases: list[argparse.Action] = []
        if debug_flag:
            self.add_argument(
                "--debug", action="store_true", help=f"show the traceback of a failure (or set {DEBUG_ENV}=1)"
            )

    def error(self, message: str):
        """One line naming the option and what is wrong with it; exit status 2."""
        self.exit(2, f"{self.prog}: error: {' '.join(str(message).split())}\n")

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        missing = [
            a.option_strings[0] for a in self._required_after_aliases if getattr(namespace, a.dest, None) is None
        ]
        if missing:
            self.error(f"the following arguments are required: {', '.join(missing)}")
        return namespace, extras


class _Deprecated(argparse.Action):
    """Stores into the canonical option's dest and says, once per use, which spelling to use."""

    def __init__(self, option_strings, dest, canonical: str, const_value: Any = None, **kwargs):
        self.canonical, self.const_value = canonical, const_value
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: note: {option_string} is deprecated; use {self.canonical}", file=sys.stderr)
        setattr(namespace, self.dest, self.const_value if self.nargs == 0 else values)


def alias(parser: argparse.ArgumentParser, canonical: str, *old: str) -> None:
    """Make each of ``old`` a hidden, deprecated spelling of ``parser``'s option ``canonical``
    (same dest, type and choices). A required canonical option is then checked after parsing,
    so that either spelling satisfies it."""
    target = next(a for a in parser._actions if canonical in a.option_strings)
    if isinstance(target, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction)):
        extra = dict(nargs=0, const_value=target.const)
    else:
        extra = dict(nargs=target.nargs, type=target.type, choices=target.choices, metavar=target.metavar)
    for spelling in old:
        parser.add_argument(
            spelling,
            dest=target.dest,
            action=_Deprecated,
            canonical=canonical,
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
            **extra,
        )
    if target.required and isinstance(parser, Parser):
        target.required = False
        parser._required_after_aliases.append(target)


# -- value types (each raises ArgumentTypeError: argparse prints "argument --x: <message>") -------
def _number(text: str, kind: type) -> float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None


def at_least(low: float, kind: type = int) -> Callable[[str], Any]:
    """A number >= ``low``."""

    def parse(text: str):
        value = _number(text, kind)
        if value < low:
            raise argparse.ArgumentTypeError(f"{text} is not >= {low}")
        return value

    parse.__name__ = f"{kind.__name__} >= {low}"
    return parse


def between(
    low: float, high: float, kind: type = float, low_open: bool = False, high_open: bool = False
) -> Callable[[str], Any]:
    """A number in the interval from ``low`` to ``high`` (each end closed unless ``*_open``)."""
    interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"

    def parse(text: str):
        value = _number(text, kind)
        if value < low or value > high or (low_open and value == low) or (high_open and value == high):
            raise argparse.ArgumentTypeError(f"{text} is not in {interval}")
        return value

    parse.__name__ = f"{kind.__name__} in {interval}"
    return parse


positive_int = at_least(1)
count = at_least(0)
port = between(1, 65535, int)


def int_list(least: int = 1) -> Callable[[str], list[int]]:
    """A comma list of integers, each >= ``least``."""

    def parse(text: str) -> list[int]:
        parts = [p.strip() for p in text.split(",")]
        if not parts or not all(re.fullmatch(r"-?\d+", p) for p in parts):
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of integers")
        values = [int(p) for p in parts]
        if min(values) < least:
            raise argparse.ArgumentTypeError(f"{text!r}: every value must be >= {least}")
        return values

    return parse


def name_list(known: Iterable[str], patterns: Sequence[str] = (), what: str = "name") -> Callable[[str], list[str]]:
    """A comma list of names, each in ``known`` or matching one of the regular expressions
    ``patterns``; empty entries are dropped, and at least one name must remain."""
    known = tuple(known)
    shown = ", ".join((*known, *(p.replace(r"-?\d+", "N").replace("\\", "") for p in patterns)))

    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in known and not any(re.fullmatch(p, n) for p in patterns)]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(map(repr, unknown or [text]))}; choose from {shown}"
            )
        return names

    return parse


def device(text: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N``."""
    if not _DEVICE.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not cpu, cuda or cuda:N")
    return text


def existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    return path


def existing_dir(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: no such folder")
    return path


def model_dir(text: str) -> Path:
    """A checkpoint folder: a folder with a ``config.json``."""
    path = existing_dir(text)
    if not (path / "config.json").is_file():
        raise argparse.ArgumentTypeError(f"{text}: no config.json there (not a checkpoint folder)")
    return path


def has_tokenizer(folder: Path) -> bool:
    """True where ``folder`` holds a Hugging Face tokenizer."""
    return any((Path(folder) / f).is_file() for f in TOKENIZER_FILES)


def tokenizer_dir(text: str) -> Path:
    """A folder holding a Hugging Face tokenizer (a model folder usually)."""
    path = existing_dir(text)
    if not has_tokenizer(path):
        raise argparse.ArgumentTypeError(f"{text}: no tokenizer there ({', '.join(TOKENIZER_FILES)})")
    return path


def _writable(path: Path, text: str) -> None:
    """The nearest existing ancestor of ``path`` must be a folder this process can write into."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: cannot write into {parent}")


def out_file(text: str) -> Path:
    """Where a file (or a stem: STEM.json, STEM.md) will be written: not a folder, and creatable."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a folder; give a file name")
    _writable(path, text)
    return path


def out_dir(text: str) -> Path:
    """Where a folder of outputs will be written: a folder or nothing yet, and creatable."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: exists and is not a folder")
    if not path.exists():
        _writable(path, text)
    return path


# -- checks after parsing ------------------------------------------------------------------------
def check_device(parser: argparse.ArgumentParser, value: str | None, flag: str = "--device") -> None:
    """A CUDA device asked for where torch sees none is a bad value, reported before any work."""
    if value is not None and value.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            parser.error(f"argument {flag}: {value}: torch sees no CUDA device here")


def prompt_counts(set_names: Sequence[str], per_set: int | None, num_prompts: int | None) -> list[int]:
    """How many prompts each set gives: ``per_set`` each, or ``num_prompts`` in all, spread over
    the sets in order (5 over two sets: 3 and 2)."""
    if num_prompts is None:
        return [per_set] * len(set_names)
    n = len(set_names)
    return [num_prompts // n + (i < num_prompts % n) for i in range(n)]


def add_prompt_counts(parser: argparse.ArgumentParser, per_set: int) -> None:
    """``--per-set N`` (default ``per_set``) or ``--num-prompts N`` (in all), not both."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--per-set", type=positive_int, default=per_set, help="prompts of each prompt set")
    group.add_argument(
        "--num-prompts",
        type=positive_int,
        default=None,
        help="prompts in all, spread over the prompt sets (instead of --per-set)",
    )


# -- running the work ----------------------------------------------------------------------------
def failure_line(exc: BaseException) -> str:
    """One line for ``exc``: a :class:`CommandError`'s message, else its type and first line."""
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else ""
    if isinstance(exc, CommandError):
        return first
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def run(prog: str, work: Callable[[], int | None], debug: bool = False) -> int:
    """``work()``'s exit status (None: 0); an exception, or ``SystemExit("message")``, becomes one
    line on stderr and status 1 (130 for Ctrl-C), and is re-raised with its traceback under
    ``debug`` or ``SGLANG_ECHO_DEBUG``."""
    debug = debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    try:
        return work() or 0
    except SystemExit as exc:  # sys.exit("message") deep in the work: the same one line
        if debug or not isinstance(exc.code, str):
            raise
        failure: BaseException = CommandError(exc.code)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 -- the one place a command's failure is reported
        if debug:
            raise
        failure = exc
    print(f"{prog}: error: {failure_line(failure)}", file=sys.stderr)
    return 1
