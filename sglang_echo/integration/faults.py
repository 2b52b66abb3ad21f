"""A drafter that fails never costs a request: its step is verified as plain decoding.

Drafting is an optimisation; verification alone decides what is committed (lossless either
way). So when the drafter of a step raises, or returns trees with a token outside the target's
vocabulary (which the target's embedding would turn into an index error on a CPU and a
device-side assert on a GPU, taking the whole server down), the workers verify every request's
root alone instead: the step commits exactly the token plain decoding would. The first fault of
each kind is logged with its traceback, later ones are counted only
(``echo_draft_faults_total{kind}``).

``SGLANG_ECHO_FAULT_INJECT`` exercises this in a running server (tests and fault drills): a
comma list of ``raise:N`` / ``garbage:N``, the drafter raising or proposing an out-of-vocabulary
token in the N-th drafting step of each worker (1-based; a drafting step is one whose drafter is
asked for proposals).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum

import torch

from sglang_echo import env
from sglang_echo.core.baselines import Autoregressive
from sglang_echo.core.policy import BuildState, build_trees
from sglang_echo.core.tree import DraftTrees

log = logging.getLogger(__name__)

ENV_INJECT = env.PREFIX + "FAULT_INJECT"


class FaultKind(StrEnum):
    RAISE = "raise"  # the drafter raised
    GARBAGE = "garbage"  # the trees hold a token outside the vocabulary


class DraftFault(RuntimeError):
    """A drafter's output that cannot be verified."""


def parse_injection(spec: str | None) -> dict[int, FaultKind]:
    """``"raise:3,garbage:7"`` -> ``{3: RAISE, 7: GARBAGE}``; a malformed entry is refused by name."""
    faults: dict[int, FaultKind] = {}
    for item in filter(None, (spec or "").split(",")):
        kind, _, step = item.strip().partition(":")
        try:
            faults[int(step)] = FaultKind(kind)
        except ValueError:
            raise ValueError(f"${ENV_INJECT}: {item!r} is not raise:N or garbage:N") from None
    return faults


class _Watched:
    """The step's drafter, watched: flags out-of-vocabulary proposals without a host sync (one
    device flag, read once after the step), and plays the fault injected for this drafting step."""

    def __init__(self, inner, guard: "DraftGuard"):
        self.inner, self.guard = inner, guard
        self.asked = False
        self.inject: FaultKind | None = None
        self.bad: torch.Tensor | None = None

    def __getattr__(self, name):  # the timing wrapper's counters, the drafter's own attributes
        return getattr(self.inner, name)

    def propose(self, frontier, k):
        if not self.asked:  # the first proposal of a step: it is a drafting step
            self.asked = True
            self.guard.drafting_steps += 1
            self.inject = self.guard.injected.get(self.guard.drafting_steps)
        if self.inject == FaultKind.RAISE:
            raise RuntimeError(f"injected drafter fault ({ENV_INJECT})")
        cands = self.inner.propose(frontier, k)
        if self.inject == FaultKind.GARBAGE:
            cands = replace(cands, tokens=torch.full_like(cands.tokens, self.guard.vocab_size))
        bad = (((cands.tokens < 0) | (cands.tokens >= self.guard.vocab_size)) & cands.valid).any()
        self.bad = bad if self.bad is None else self.bad | bad
        return cands


@dataclass
class DraftGuard:
    """Builds a step's trees; on a drafter fault, the root-only trees of plain decoding."""

    vocab_size: int
    on_fault: Callable[[FaultKind], None] = lambda kind: None  # the metrics' counter
    injected: dict[int, FaultKind] | None = None  # drafting step (1-based) -> fault to play
    drafting_steps: int = 0  # steps whose drafter was asked for proposals

    def __post_init__(self) -> None:
        if self.injected is None:
            self.injected = parse_injection(env.get(ENV_INJECT))
        self._logged: set[FaultKind] = set()

    def build(self, policy, drafter, roots: torch.Tensor, k_max: int | None) -> tuple[DraftTrees, BuildState, bool]:
        """``build_trees(policy, drafter, roots, k_max)``, watched; the flag says whether it faulted."""
        watched = _Watched(drafter, self)
        try:
            trees, state = build_trees(policy, watched, roots, k_max=k_max)
            if watched.bad is not None and bool(watched.bad):
                raise DraftFault(f"the drafter proposed token ids outside the vocabulary [0, {self.vocab_size})")
        except Exception as e:
            fault = FaultKind.GARBAGE if isinstance(e, DraftFault) else FaultKind.RAISE
            self._report(fault, e)
            trees, state = build_trees(Autoregressive(), drafter, roots)
            return trees, state, True
        return trees, state, False

    def _report(self, kind: FaultKind, error: Exception) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            log.error(
                "ECHO: the drafter failed (%s); this step and any later failing one are verified as "
                "plain decoding (counted in echo_draft_faults_total)",
                kind,
                exc_info=error,
            )
        try:
            self.on_fault(kind)
        except Exception:  # metrics never take the server down
            pass
