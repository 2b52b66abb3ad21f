"""RecordedDrafter: serves ``propose(frontier, k)`` from a trace, so the real policies run unchanged.

It implements :class:`sglang_echo.core.policy.TreeDrafter` (and the full
:class:`sglang_echo.drafters.base.Drafter` lifecycle), answering every request exactly as the
recorded drafter did at that position:

* Each batch row sits at one recorded tree (a prompt and a position). The simulator sets it with
  :meth:`seek`; inside the offline loop :meth:`start` finds each prompt in the trace and
  :meth:`catch_up` advances the position by the committed tokens, refusing tokens that differ
  from the recorded greedy continuation (a diverged stream cannot be replayed).
* ``propose`` at depth 0 expands the roots; deeper, ``frontier.source`` names the candidate
  columns of the previous call, whose trace nodes it remembers. The children of a node are its
  first ``min(k, n_kept)`` recorded children, in the drafter's order, laid out as the repo's
  drafters lay them out (frontier slot ``f``'s children in columns ``f*k .. f*k+k-1``), so
  stable sorts break ties identically.
* Coverage: a request the trace cannot fully answer (a node never expanded in the recording,
  children pruned by the node cap, or ``k`` above the recorded width where the drafter had more)
  is counted in :class:`Coverage` and served with what the trace has; nothing is invented.
* Device: the trace's node arrays live on ``device`` (the CPU by default), so a server's
  simulated acceptance (:mod:`sglang_echo.integration.simulate`) serves a GPU step without host
  round trips; ``track=False`` also skips the coverage counts and propose shapes, whose
  ``int()`` would synchronise the device at every depth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

from sglang_echo.core.policy import Frontier
from sglang_echo.core.tree import Candidates
from sglang_echo.drafters.base import Drafter

from .trace import Trace


class StreamDiverged(RuntimeError):
    """The committed tokens left the recorded greedy continuation."""


@dataclass
class Coverage:
    """How much of what the policies asked for the trace could answer."""

    expansions: int = 0  # frontier nodes the policy asked to expand
    missed: int = 0  # of which the trace could not answer completely
    unexpanded: int = 0  # missed because the recording never expanded the node
    missing_children: int = 0  # children known to exist but not recorded (cap, width)

    @property
    def fraction(self) -> float:
        return 1.0 - self.missed / self.expansions if self.expansions else 1.0

    def add(self, other: "Coverage") -> None:
        for k in ("expansions", "missed", "unexpanded", "missing_children"):
            setattr(self, k, getattr(self, k) + getattr(other, k))

    def as_dict(self) -> dict:
        return {
            "expansions": self.expansions,
            "missed": self.missed,
            "unexpanded": self.unexpanded,
            "missing_children": self.missing_children,
            "fraction": self.fraction,
        }


class RecordedDrafter(Drafter):
    name = "recorded"
    captured_layers: tuple[int, ...] = ()  # needs no target features

    def __init__(self, trace: Trace, device: torch.device | str = "cpu", *, track: bool = True):
        self.trace = trace
        self.width = trace.meta.width
        self.device = torch.device(device)
        self.track = track  # count coverage and propose shapes (host syncs off the CPU)
        dev = self.device
        self.first_child = trace.global_first_child().to(dev)
        self.roots = trace.tree_roots().to(dev)
        self._token, self._logprob = trace.token.to(dev), trace.logprob.to(dev)
        self._n_kept, self._n_avail = trace.n_kept.to(dev), trace.n_avail.to(dev)
        self.coverage = Coverage()
        self.propose_shapes: list[tuple[int, int, int, int]] = []  # (depth, B, F, valid) per call
        self._rows = torch.zeros(0, dtype=torch.int64, device=dev)  # [B] current tree per row, -1 none
        self._cand_node: Optional[Tensor] = None
        self._prompt: list[int] = []
        self._gen: list[int] = []

    # -- the simulator's API ----------------------------------------------------------------------
    def seek(self, trees: Tensor) -> None:
        """Put row ``b`` at tree ``trees[b]`` (-1: nothing to draft) for the next step."""
        self._rows = trees.long().to(self.device)
        self._cand_node = None

    # -- the Drafter lifecycle (inside the offline loop) ------------------------------------------
    def start(self, prompts: Sequence[Tensor]) -> None:
        index = {tuple(self.trace.prompt(p).tolist()): p for p in range(self.trace.num_prompts)}
        self._prompt = []
        for b, pr in enumerate(prompts):
            key = tuple(pr.reshape(-1).cpu().tolist())
            if key not in index:
                raise KeyError(f"request {b}: prompt not in the trace")
            self._prompt.append(index[key])
        self._gen = [0] * len(prompts)
        self.seek(torch.full((len(prompts),), -1))

    def catch_up(self, tokens: Sequence[Tensor], features=None) -> None:
        trees = []
        for b, t in enumerate(tokens):
            p, new = self._prompt[b], [int(x) for x in t.reshape(-1).cpu().tolist()]
            if self._gen[b] == 0 and new:  # the prefill catch-up: prompt[1:] + [first token]
                new = new[self.trace.prompt(p).numel() - 1 :]
            out = self.trace.output(p)
            g = self._gen[b]
            if new and out[g : g + len(new)].tolist() != new:
                raise StreamDiverged(
                    f"request {b} (trace prompt {p}): committed {new} at {g}, recorded {out[g : g + len(new)].tolist()}"
                )
            self._gen[b] = g + len(new)
            pos = self._gen[b] - 1  # the root is the last committed token o_pos
            ok = 0 <= pos < self.trace.num_positions(p)
            trees.append(int(self.trace.tree_indptr[p]) + pos if ok else -1)
        self.seek(torch.tensor(trees, dtype=torch.int64))

    # -- TreeDrafter ------------------------------------------------------------------------------
    @torch.no_grad()
    def propose(self, frontier: Frontier, k: int) -> Candidates:
        dev, here = frontier.slots.device, self.device
        B, F = frontier.slots.shape
        valid = frontier.valid.to(here)
        if frontier.depth == 0:
            node = torch.where(self._rows >= 0, self.roots[self._rows.clamp(min=0)], -1)[:, None].expand(B, F)
        else:
            node = self._cand_node.gather(1, frontier.source.to(here).clamp(min=0))
        valid = valid & (node >= 0)
        n = node.clamp(min=0)
        kept, avail = self._n_kept[n], self._n_avail[n]
        j = torch.arange(k, device=here)
        ok = valid[..., None] & (j < kept[..., None])  # [B, F, k]
        child = torch.where(ok, self.first_child[n][..., None] + j, torch.full_like(ok, -1, dtype=torch.int64))
        c = child.clamp(min=0)
        if self.track:
            self._count(valid, kept, avail, k, frontier.depth, B, F)
        self._cand_node = child.reshape(B, F * k)
        return Candidates(
            tokens=torch.where(ok, self._token[c], 0).reshape(B, F * k).to(dev),
            logprob=torch.where(ok, self._logprob[c], float("-inf")).reshape(B, F * k).to(dev),
            parent=torch.arange(F, device=dev).repeat_interleave(k).expand(B, F * k).contiguous(),
            valid=ok.reshape(B, F * k).to(dev),
        )

    def _count(self, valid: Tensor, kept: Tensor, avail: Tensor, k: int, depth: int, B: int, F: int) -> None:
        """Coverage: what the live drafter would have returned vs what the trace holds."""
        served = kept.clamp(max=k)
        known = (avail >= 0) & ((avail < self.width) | (k <= self.width))
        want = torch.where(known, avail.clamp(max=k), torch.full_like(avail, k))
        miss = valid & ((avail < 0) | (served < want) | ~known)
        self.coverage.expansions += int(valid.sum())
        self.coverage.missed += int(miss.sum())
        self.coverage.unexpanded += int((valid & (avail < 0)).sum())
        self.coverage.missing_children += int(torch.where(valid & known, want - served, 0).sum())
        self.propose_shapes.append((depth, B, F, int(valid.sum())))
