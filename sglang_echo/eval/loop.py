"""The offline speculative step loop (gpt-fast style), for acceptance measurements and calibration.

::

    drafter.start([p.to(dev) for p in prompts])  # every tensor handed to the drafter is on the target's device
    first, feats = target.prefill(prompts)
    drafter.catch_up(prompt[1:] + [first], feats)                # features of the prompt positions
    while some request is unfinished:
        trees, state = build_trees(policy, drafter, roots)       # roots = last committed tokens
        logits, feats = target.verify(trees)
        res = greedy_verify(trees, logits)
        target.commit(res, active)
        drafter.catch_up(res.new_tokens, feats[accepted path])    # root first

A request finishes at ``max_new_tokens`` or at ``eos_id`` (kept in its output); its output is
truncated exactly where autoregressive decoding would stop. A finished request keeps its root in
every later tree (the batch shape never changes) but is switched off for drafting (the policy
treats it as an inactive request, so it drafts nothing and takes no budget), commits nothing, is
given empty tensors by ``catch_up`` and is left out of every statistic.

Time is measured with ``time.perf_counter`` (synchronising CUDA first): *draft* = tree building
(the drafter's proposals plus the policy) and the drafter's catch-up; *verify* = the target pass,
greedy verification and the KV commit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import Tensor

from sglang_echo.core.baselines import Autoregressive
from sglang_echo.core.metrics import MetricsTotals, StepMetrics
from sglang_echo.core.policy import BuildState, TreePolicy, build_trees
from sglang_echo.core.tree import Candidates, DraftTrees
from sglang_echo.core.verify import greedy_verify


@dataclass
class GenerationResult:
    """Outputs and per-step records of one batch. Per-step tensors are ``[B]``; rows of requests
    that had already finished before the step hold ``-1`` (``accept_len``) / ``0`` (sizes)."""

    tokens: list[list[int]]  # generated tokens per request (max_new_tokens, or up to and incl. eos)
    steps: int = 0  # verification passes (prefill excluded)
    active: list[Tensor] = field(default_factory=list)  # per step [B] bool: request took part
    accept_len: list[Tensor] = field(default_factory=list)  # per step [B] L_i (bonus excluded), -1 inactive
    tree_size: list[Tensor] = field(default_factory=list)  # per step [B] K_i (root included), 0 inactive
    verified: list[int] = field(default_factory=list)  # per step: verified tokens of active requests
    verified_total: list[int] = field(default_factory=list)  # per step: every node of the pass (finished roots too)
    draft_s: list[float] = field(default_factory=list)
    verify_s: list[float] = field(default_factory=list)
    prefill_s: float = 0.0
    total_s: float = 0.0
    totals: MetricsTotals = field(default_factory=MetricsTotals)  # core.metrics over the active rows

    @property
    def request_steps(self) -> int:
        return int(sum(int(a.sum()) for a in self.active))

    @property
    def mat(self) -> float:
        """Mean accepted tokens per request per step, bonus included: ``mean(L_i + 1)`` over every
        (request, step) the request took part in (committed tokens / request-steps, before the
        truncation at ``max_new_tokens``)."""
        n = self.request_steps
        return sum(float((a[a >= 0] + 1).sum()) for a in self.accept_len) / n if n else 0.0

    def request_mat(self, b: int) -> float:
        acc = [int(a[b]) for a in self.accept_len if int(a[b]) >= 0]
        return sum(x + 1 for x in acc) / len(acc) if acc else 0.0

    @property
    def mean_verified(self) -> float:
        """Verified tokens (roots included) per step, over the requests still running."""
        return sum(self.verified) / self.steps if self.steps else 0.0

    @property
    def num_generated(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def draft_ms(self) -> float:
        return 1e3 * sum(self.draft_s) / self.steps if self.steps else 0.0

    @property
    def verify_ms(self) -> float:
        return 1e3 * sum(self.verify_s) / self.steps if self.steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.num_generated / self.total_s if self.total_s > 0 else 0.0


def policy_k_max(policy: TreePolicy) -> Optional[int]:
    """The batch verification cap of a budgeted policy (None for unbudgeted ones)."""
    if not getattr(policy, "budgeted", False):
        return None
    cfg = getattr(policy, "config", None)
    return getattr(cfg, "k_max", None) if cfg is not None and hasattr(cfg, "k_max") else getattr(policy, "k_max", None)


class _OnlyActive(TreePolicy):
    """``policy`` with some requests switched off from the start (finished requests): the policy
    itself then drops their candidates, so they draft nothing and take no budget."""

    def __init__(self, policy: TreePolicy, active: Tensor):
        self.inner, self.mask = policy, active
        self.name, self.max_depth = policy.name, policy.max_depth
        self.children_per_node, self.budgeted = policy.children_per_node, policy.budgeted

    def start(self, roots: Tensor, k_max: int | None = None) -> BuildState:
        state = self.inner.start(roots, k_max)
        state.active = state.active & self.mask.to(state.active.device)
        return state

    def advance(self, state: BuildState, cands: Candidates) -> None:
        self.inner.advance(state, cands)

    def finish(self, state: BuildState) -> DraftTrees:
        return self.inner.finish(state)


class _NoDrafter:
    def start(self, prompts) -> None:
        pass

    def catch_up(self, tokens, features) -> None:
        pass

    def propose(self, frontier, k):
        raise RuntimeError("this policy drafts: pass a drafter")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _finish_tokens(out: list[int], new: list[int], max_new: int, eos_id: Optional[int]) -> bool:
    """Append ``new`` to ``out`` up to ``max_new`` tokens / the first eos; True when finished."""
    for t in new:
        if len(out) >= max_new:
            return True
        out.append(t)
        if eos_id is not None and t == eos_id:
            return True
    return len(out) >= max_new


def speculative_generate(
    target,
    drafter,
    policy: TreePolicy,
    prompts: Sequence[Tensor],
    max_new_tokens: int,
    eos_id: Optional[int] = None,
) -> GenerationResult:
    """Greedy speculative decoding of one batch (see the module docstring)."""
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1")
    drafter = drafter if drafter is not None else _NoDrafter()
    prompts = [torch.as_tensor(p, dtype=torch.long).reshape(-1).cpu() for p in prompts]
    B, dev = len(prompts), target.device
    k_max = policy_k_max(policy)
    res_out = GenerationResult(tokens=[[] for _ in range(B)])

    _sync(dev)
    t_start = time.perf_counter()
    drafter.start([p.to(dev) for p in prompts])  # every tensor handed to the drafter is on the target's device
    first, feats = target.prefill(prompts)
    first_l = first.tolist()
    finished = [_finish_tokens(res_out.tokens[b], [first_l[b]], max_new_tokens, eos_id) for b in range(B)]
    drafter.catch_up(
        [torch.cat([p[1:], first[b : b + 1].cpu()]).to(dev) for b, p in enumerate(prompts)],
        feats,
    )
    last = first.clone()
    _sync(dev)
    res_out.prefill_s = time.perf_counter() - t_start

    while not all(finished):
        active = torch.tensor([not f for f in finished], device=dev)
        t0 = time.perf_counter()
        trees, state = build_trees(_OnlyActive(policy, active), drafter, last)
        _sync(dev)
        t1 = time.perf_counter()
        logits, node_feats = target.verify(trees)
        vr = greedy_verify(trees, logits)
        target.commit(vr, active)
        _sync(dev)
        t2 = time.perf_counter()

        acc = vr.accept_len.tolist()
        new_tokens = vr.new_tokens.tolist()
        path = vr.accepted_nodes
        act = active.tolist()
        cu_tokens, cu_feats = [], []
        for b in range(B):
            n = acc[b] + 1 if act[b] else 0
            cu_tokens.append(vr.new_tokens[b, :n].to(dev))
            if node_feats is not None:
                cu_feats.append(node_feats[path[b, :n].to(node_feats.device)])
        drafter.catch_up(cu_tokens, cu_feats if node_feats is not None else None)
        _sync(dev)
        t3 = time.perf_counter()

        for b in range(B):
            if act[b]:
                finished[b] = _finish_tokens(res_out.tokens[b], new_tokens[b][: acc[b] + 1], max_new_tokens, eos_id)
        last = torch.where(active, vr.bonus.to(dev), last)

        act_cpu = active.cpu()
        sizes = trees.sizes.cpu()
        res_out.steps += 1
        res_out.active.append(act_cpu)
        res_out.accept_len.append(torch.where(act_cpu, vr.accept_len.cpu(), torch.full_like(vr.accept_len.cpu(), -1)))
        res_out.tree_size.append(torch.where(act_cpu, sizes, torch.zeros_like(sizes)))
        res_out.verified.append(int(sizes[act_cpu].sum()))
        res_out.verified_total.append(int(sizes.sum()))
        res_out.draft_s.append((t1 - t0) + (t3 - t2))
        res_out.verify_s.append(t2 - t1)
        res_out.totals.add(
            StepMetrics(
                tree_size=sizes[act_cpu],
                tree_depth=trees.max_depth().cpu()[act_cpu],
                accept_len=vr.accept_len.cpu()[act_cpu],
                gate_evaluated=state.gate_evaluated.cpu(),
                gate_passed=state.gate_passed.cpu(),
                k_max=k_max,
            )
        )
    _sync(dev)
    res_out.total_s = time.perf_counter() - t_start
    return res_out


def autoregressive_generate(
    target,
    prompts: Sequence[Tensor],
    max_new_tokens: int,
    eos_id: Optional[int] = None,
) -> GenerationResult:
    """Plain greedy decoding: the same loop with root-only trees (one token per request per pass).
    Tests check it against HF ``generate(do_sample=False)``."""
    return speculative_generate(target, None, Autoregressive(), prompts, max_new_tokens, eos_id)
