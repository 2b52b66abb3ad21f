"""ECHO's unified elastic budget scheduler (Alg. 1) over the batch as one super-tree.

The whole batch shares one verification cap, ``sum_i K_i <= K_max`` (Eq. 4; K_i counts request
i's root, so ``K_max - B`` draft tokens are shared). Depth by depth:

* **Priority 1, global depth extension** (Alg. 1 lines 5-15): every active request drafts its
  depth-d candidates. At a sweet-spot depth the gate ``c_{i,d} >= tau_d`` (Eq. 6-7) decides;
  elsewhere the request passes. Passing requests take their ``W_def`` best candidates (by path
  score) from the shared pool, most confident first (Theorem 2: budget goes where the marginal
  gain is highest); a failing request is truncated at d and yields its share to the others.
* **Priority 2, opportunistic width expansion** (Alg. 1 lines 16-20): only once no request can
  deepen (every request truncated, out of depth, or the budget is gone), the remaining budget
  widens truncated requests at their truncation depth, up to ``W_max`` candidates each.

Under low load (Case 1) Priority 1 cannot use the whole budget and a truncated request is widened
in place ("truncate-and-widen"); under high load (Case 2) the budget is consumed by confident
requests' depth before any width is granted.

**W_def follows the budget's share.** A step grants at most ``round((K - B) / (B * max_depth))``
candidates per request and depth (at least 1, at most ``W_def``): the width at which every
request could draft every depth within the step's cap ``K``. Where the cap is tight, a second
sibling (accepted only if the best child is not) is worth less than another request's best child
or a confident request's next depth (Theorem 2's marginal-gain order), and at W_def 2 the first
depth alone would spend the budget. Eight SmolLM2 requests under K_max 33 and depth 4 accept
2.59 tokens per step at width 1 against 2.42 at 2; under K_max 64 (share 1.75) width 2 wins,
2.89 against 2.65; one request keeps W_def.

Dense gating and the fixed-threshold ablations are this policy with another
:class:`~sglang_echo.core.gating.GatingConfig`. With ``kernel="triton"`` each depth (and
Priority 2) runs as one Triton program (:mod:`sglang_echo.kernels.control.elastic`, for GPUs,
where the ~60 tensor ops of an eager depth are launch-bound); the trees are the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import torch
from torch import Tensor

from .gating import GatingConfig, layer_confidence
from .policy import BuildState, TreePolicy, grant_in_priority, ranked, take_top
from .tree import Candidates


class ControlKernel(StrEnum):
    """How the control plane runs: tensor ops, or one Triton program a depth (``kernels/control``).
    ``auto`` is a server setting, resolved before a policy is made (the fused kernels on a GPU
    where they pass their start-up check: ``kernels/control/selfcheck.py``)."""

    TORCH = "torch"
    TRITON = "triton"
    AUTO = "auto"


KERNELS = (ControlKernel.TORCH, ControlKernel.TRITON)  # what a policy runs


@dataclass(frozen=True)
class FusedControl:
    """Alg. 1 as fused programs (``control_kernel: triton``): ``depth`` runs one draft depth (the
    pool append, Eq. 6-7, Priority 1, the truncation record) and ``select`` Priority 2, with the
    signatures of :func:`sglang_echo.kernels.control.elastic.elastic_depth` and ``elastic_select``.
    The kernels package provides it (``sglang_echo.kernels.control.TRITON``): the core never imports
    the kernels, its callers hand it in (:func:`~sglang_echo.core.factory.make_policy`)."""

    depth: Callable
    select: Callable


@dataclass(frozen=True)
class ElasticConfig:
    k_max: int  # verification cap for the whole batch, roots included (Eq. 4)
    max_depth: int = 8  # deepest draft depth ever considered
    w_def: int = 1  # default width per depth for requests that pass (Alg. 1 W_def)
    w_max: int = 4  # width cap for Priority-2 expansion (Alg. 1 W_max)

    def __post_init__(self) -> None:
        if self.k_max < 1 or self.max_depth < 0 or not 1 <= self.w_def <= self.w_max:
            raise ValueError(f"need k_max >= 1, max_depth >= 0 and 1 <= w_def <= w_max, got {self}")


class ElasticPolicy(TreePolicy):
    """ECHO (Alg. 1). With ``gating=GatingConfig.dense(...)`` or ``.fixed(...)``, its ablations."""

    budgeted = True

    def __init__(
        self, config: ElasticConfig, gating: GatingConfig, name: str = "echo", fused: FusedControl | None = None
    ):
        """``fused``: run each depth and Priority 2 as the given fused programs (the same trees)."""
        self.config, self.gating, self.name, self.fused = config, gating, name, fused
        self.kernel = ControlKernel.TORCH if fused is None else ControlKernel.TRITON
        self.max_depth = config.max_depth
        # W_max children per frontier node, so even the root's depth can be widened to W_max.
        self.children_per_node = config.w_max
        # Host-side tables: reading them never waits for the device.
        self._tau = gating.threshold_table(config.max_depth).tolist()
        self._gated = [d in gating.depths for d in range(config.max_depth + 1)]
        if fused is not None:  # the kernel writes each depth's pool columns in place
            self.pool_capacity = 1 + config.max_depth * config.w_def * config.w_max

    def start(self, roots: Tensor, k_max: int | None = None) -> BuildState:
        state = super().start(roots)
        B, dev = roots.numel(), roots.device
        # The budget stays on the device: the step's only host syncs are the loop's "any request
        # still active?" per depth and the final compaction (GPU launch queues never drain here).
        cap = self.config.k_max if k_max is None else k_max
        state.budget = torch.full((), max(cap - B, 0), dtype=torch.int64, device=dev)
        state.active &= state.budget > 0
        state.extra.update(
            width=self.step_width(B, cap),
            trunc_slots=torch.full((B, self.config.w_max), -1, dtype=torch.int64, device=dev),
            trunc_conf=torch.zeros(B, device=dev),
            truncated=torch.zeros(B, dtype=torch.bool, device=dev),
        )
        return state

    def step_width(self, batch_size: int, cap: int) -> int:
        """Priority 1's width this step: ``W_def``, narrowed to the budget's share per request and
        depth (module docstring), at least 1."""
        share = max(cap - batch_size, 0) / (batch_size * max(self.config.max_depth, 1))
        return max(1, min(self.config.w_def, round(share)))

    def advance(self, state: BuildState, cands: Candidates) -> None:
        if self.fused is not None and cands.proposal_dists is None:
            return self._advance_fused(state, cands)
        cfg, pool = self.config, state.pool
        d = state.depth + 1
        slots = pool.append(cands, state.frontier_slots, d)
        valid = pool.newest(pool.valid, slots) & state.active[:, None]
        score = pool.newest(pool.score, slots)
        conf = layer_confidence(score, valid)  # Eq. 6
        order, n_valid = ranked(score, valid)
        has_cands = state.active & (n_valid > 0)

        gated = self._gated[d]
        passed = has_cands & (conf >= self._tau[d]) if gated else has_cands  # Eq. 7
        if gated:
            failed = has_cands & ~passed
            state.gate_evaluated[d] += has_cands.sum()
            state.gate_passed[d] += passed.sum()

        # Priority 1: depth for passing requests, most confident first, within the budget.
        want = torch.where(passed, n_valid.clamp(max=state.extra["width"]), 0)
        grant = grant_in_priority(want, torch.where(passed, conf, -1.0), state.budget)
        state.budget = state.budget - grant.sum()
        kept, kept_cols = take_top(slots, order, grant, cfg.w_def)
        pool.mark(kept, kept >= 0)
        state.set_frontier(kept, kept_cols)

        # Truncation at a failing gate (only gated depths can fail): remember the best W_max
        # candidates for Priority 2.
        if gated:
            ex = state.extra
            best, _ = take_top(slots, order, n_valid.clamp(max=cfg.w_max), cfg.w_max)
            ex["trunc_slots"] = torch.where(failed[:, None], best, ex["trunc_slots"])
            ex["trunc_conf"] = torch.where(failed, conf, ex["trunc_conf"])
            ex["truncated"] |= failed

        state.active = passed & (grant > 0) & (state.budget > 0)
        state.depth = d

    def _advance_fused(self, state: BuildState, cands: Candidates) -> None:
        """``advance`` as one fused program (the same steps, Alg. 1 lines 5-15)."""
        d, cfg = state.depth + 1, self.config
        slots, source, tokens, path_score, state.active, state.budget = self.fused.depth(
            state.pool,
            cands,
            state.frontier_slots,
            state.active,
            state.budget,
            state.extra,
            state.gate_evaluated,
            state.gate_passed,
            depth=d,
            tau=self._tau[d],
            gated=self._gated[d],
            w_def=cfg.w_def,
            w_max=cfg.w_max,
            width=state.extra["width"],
        )
        state.set_frontier(slots, source, (tokens, path_score))
        state.depth = d

    def select(self, state: BuildState) -> None:
        # Priority 2 runs only here, after no request can deepen any more (unconditionally: with
        # no budget left or nothing truncated every grant is 0, and no host sync is needed).
        ex, w_max = state.extra, self.config.w_max
        if self.fused is not None:
            state.budget, ex["widened"] = self.fused.select(state.pool, state.budget, ex, w_max)
            return
        avail = (ex["trunc_slots"] >= 0).sum(1)
        want = torch.where(ex["truncated"], avail.clamp(max=w_max), 0)
        grant = grant_in_priority(want, torch.where(ex["truncated"], ex["trunc_conf"], -1.0), state.budget)
        state.budget = state.budget - grant.sum()
        cols = torch.arange(w_max, device=grant.device)[None, :]
        state.pool.mark(ex["trunc_slots"], cols < grant[:, None])
        ex["widened"] = grant
