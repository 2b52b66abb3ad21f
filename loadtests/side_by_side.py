"""Several servers (and passes) in one sweep: each level runs against every server in turn.

Sweeping one server after the other puts minutes between the levels being compared, and a
shared VM drifts by 10-30% over minutes (``benchmarks/results/loadtest-smollm2-cpu-defaults/``:
`none` itself ran 23% faster at 8 users 20 minutes later). Here every level runs against each
server back to back, in an order that flips from level to level and from pass to pass
(``A B | B A | A B ...``), so a drift that is slow against one level falls on every server
alike. ``--repeats`` passes give each ratio a spread to be read against.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .levels import Sweep
from .summary import LevelResult


@dataclass(frozen=True)
class Target:
    """One server under test: its label in the results and its base URL."""

    name: str
    url: str


def parse_target(text: str) -> Target:
    """``NAME=URL`` (``echo=http://127.0.0.1:30100``), or a bare URL (no name: one server only)."""
    name, sep, url = text.partition("=")
    if not sep or "://" in name:  # a bare URL, perhaps with "=" in its query
        return Target("", text)
    if not name.replace("-", "").replace("_", "").isalnum() or name.startswith("pass"):
        raise ValueError(
            f"--host {text!r}: the name before '=' labels a results folder; use "
            "letters, digits, - and _ (and not pass<N>, the passes' folders)"
        )
    return Target(name, url)


def check_targets(targets: Sequence[Target]) -> None:
    names = [t.name for t in targets]
    if len(targets) > 1 and not all(names):
        raise ValueError(
            "several --host: name each one, e.g. --host none=http://127.0.0.1:30100 --host echo=http://127.0.0.1:30200"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"--host names must differ, got {names}")


def result_folder(out: Path, target: Target, pass_index: int, *, targets: int, passes: int) -> Path:
    """``out`` for one server and one pass (as a plain sweep writes), else
    ``out/[pass<k>/][<name>/]``: a pass's folders are named by server, which labels them in
    :mod:`loadtests.compare`."""
    folder = out / f"pass{pass_index + 1}" if passes > 1 else out
    return folder / target.name if targets > 1 else folder


def level_order(targets: Sequence[Target], pass_index: int, level_index: int) -> list[Target]:
    """The servers in the order this level runs them: flipped every level and every pass."""
    return list(targets) if (pass_index + level_index) % 2 == 0 else list(reversed(targets))


RunLevel = Callable[[Target, int, int], LevelResult]  # (server, pass index, users) -> its level


def run_passes(
    targets: Sequence[Target], passes: int, users: Sequence[int], run_level: RunLevel
) -> dict[str, list[list[LevelResult]]]:
    """Every (pass, level, server) once, each level against every server in the order
    :func:`level_order` gives; ``results[name][k]``: server ``name``'s levels of pass ``k``,
    in ``users`` order."""
    results: dict[str, list[list[LevelResult]]] = {t.name: [[] for _ in range(passes)] for t in targets}
    for k in range(passes):
        for i, n in enumerate(users):
            for target in level_order(targets, k, i):
                results[target.name][k].append(run_level(target, k, n))
    return results


def sweeps_for(base: Sweep, models: dict[Target, str], passes: int, out: Path) -> dict[str, list[Sweep]]:
    """One :class:`Sweep` per server and pass: ``base``'s settings, each server's URL, model
    (``models``: server -> the model it serves) and folder."""
    return {
        t.name: [
            replace(base, host=t.url, model=model, out=result_folder(out, t, k, targets=len(models), passes=passes))
            for k in range(passes)
        ]
        for t, model in models.items()
    }
