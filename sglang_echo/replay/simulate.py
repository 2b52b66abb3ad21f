"""Replay a policy over a trace: the real ``build_trees`` + ``greedy_verify``, no target model.

Each step, every batch row is a request at some position of a recorded stream. The row's tree
is built by the *real* policy (``make_policy`` + :func:`~sglang_echo.core.policy.build_trees`)
from a :class:`~sglang_echo.replay.drafter.RecordedDrafter`, and verified by the real
:func:`~sglang_echo.core.verify.greedy_verify` against the recorded continuation: the target's
argmax at a node of depth ``d`` below root ``o_s`` is taken to be ``o_{s+d+1}``. That is the true
argmax for every node on the greedy path; for nodes off it the value is irrelevant, because a
node is accepted only if all its ancestors are, so the accepted path, its length and the bonus
are exactly what the target would give.

Two batch compositions:

* :func:`replay_offline` mirrors :func:`sglang_echo.eval.speculative_generate` step for step: a
  fixed batch, finished requests keep an inactive root (counted in the verified tokens and in the
  policy's ``B``, as there). This is what the validation compares exactly.
* :func:`replay_serving` is a server at concurrency ``B``: ``B`` slots, each a recorded stream
  advancing by ``L_i + 1`` per step; a finished stream's slot is taken by the next stream of an
  endless round-robin queue over the trace (its prefill is not modelled). When ``B`` exceeds the
  number of streams, copies of a stream start at staggered positions so the batch is not
  ``B / P`` identical requests in lockstep. The run stops once ``min_tokens`` tokens are
  committed and ``min_steps`` steps are done, so ECHO's shared ``K_max`` acts across a full batch
  at every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import Tensor

from sglang_echo.core.policy import TreePolicy, build_trees
from sglang_echo.core.verify import greedy_verify
from sglang_echo.eval.loop import (
    _OnlyActive,  # the offline loop's own finished-request masking
)

from .drafter import Coverage, RecordedDrafter
from .oracle import RankedReference, oracle_accepted
from .trace import Trace


@dataclass
class ReplayResult:
    """Per-step records of one replay. Per-request tensors are ``[B]`` with ``-1`` (accept_len)
    / ``0`` (tree_size) for rows that did not take part, like :class:`GenerationResult`."""

    policy: str
    batch_size: int
    k_max: int
    accept_len: list[Tensor] = field(default_factory=list)
    tree_size: list[Tensor] = field(default_factory=list)
    verified_total: list[int] = field(default_factory=list)  # every node of the pass
    committed: list[int] = field(default_factory=list)  # tokens produced (cut at stream ends)
    oracle_kmax: list[int] = field(default_factory=list)  # J* with budget K_max
    oracle_matched: list[int] = field(default_factory=list)  # J* with the policy's own verified tokens
    ranked_kmax: list[int] = field(default_factory=list)  # RankedReference with budget K_max
    draft_calls: list[list[tuple[int, int, int, int]]] = field(default_factory=list)  # propose shapes
    catch_up: list[tuple[int, int]] = field(default_factory=list)  # (rows, max tokens per row)
    coverage: Coverage = field(default_factory=Coverage)
    streams_finished: int = 0

    @property
    def steps(self) -> int:
        return len(self.accept_len)

    def _sum(self, f) -> float:
        return float(sum(f(a) for a in self.accept_len))

    @property
    def request_steps(self) -> int:
        return int(self._sum(lambda a: (a >= 0).sum()))

    @property
    def accepted(self) -> int:
        return int(self._sum(lambda a: a[a >= 0].sum()))

    @property
    def mat(self) -> float:
        """Mean accepted tokens per request per step, bonus included (as the offline loop)."""
        n = self.request_steps
        return (self.accepted + n) / n if n else 0.0

    @property
    def verified(self) -> int:
        return int(sum(int(t.sum()) for t in self.tree_size))

    def summary(self) -> dict:
        s = max(self.steps, 1)
        acc, orc, orm, rnk = self.accepted, sum(self.oracle_kmax), sum(self.oracle_matched), sum(self.ranked_kmax)
        return {
            "policy": self.policy,
            "batch": self.batch_size,
            "k_max": self.k_max,
            "steps": self.steps,
            "mat": self.mat,
            "accepted_per_step": acc / s,  # sum_i L_i: drafted tokens accepted (Eq. 11's J)
            "committed_per_step": (acc + self.request_steps) / s,  # bonus included
            "verified_per_step": sum(self.verified_total) / s,  # roots included (K_total)
            "verified_over_k_max": sum(self.verified_total) / s / self.k_max,
            "oracle_accepted_per_step": orc / s,
            "oracle_fraction": acc / orc if orc else (1.0 if acc == 0 else float("inf")),
            "oracle_matched_fraction": acc / orm if orm else 1.0,
            "ranked_accepted_per_step": rnk / s,
            "ranked_fraction": acc / rnk if rnk else (1.0 if acc == 0 else float("inf")),
            "ranked_oracle_fraction": rnk / orc if orc else 1.0,
            "yield": acc / max(self.verified - self.request_steps, 1),
            "coverage": self.coverage.fraction,
            "coverage_detail": self.coverage.as_dict(),
            "streams_finished": self.streams_finished,
        }


class _Replayer:
    """What both batch compositions share: one step of build, verify and bookkeeping."""

    def __init__(self, trace: Trace, policy: TreePolicy, drafter: Optional[RecordedDrafter], k_max: int):
        self.trace, self.policy, self.k_max = trace, policy, k_max
        self.drafter = drafter or RecordedDrafter(trace)
        self.drafter.coverage = Coverage()
        self.drafter.propose_shapes = []
        self.true_len = trace.true_path_length()
        self.ranked = RankedReference(trace, policy.max_depth)
        self.out_lo, self.out_hi = trace.output_indptr[:-1], trace.output_indptr[1:]

    def step(self, res: ReplayResult, prompt: Tensor, gen: Tensor, active: Tensor, roots: Tensor) -> Tensor:
        """One speculative step for rows at ``o_{gen-1}`` of ``prompt``; returns ``L_i`` ``[B]``."""
        tr = self.trace
        tree = torch.where(active, tr.tree_indptr[prompt] + gen - 1, -1)
        self.drafter.seek(tree)
        n_calls = len(self.drafter.propose_shapes)
        trees, _ = build_trees(_OnlyActive(self.policy, active), self.drafter, roots)
        # The target's argmax at a depth-d node below root o_s is o_{s+d+1} (see module doc).
        req = trees.request_of_node
        idx = self.out_lo[prompt][req] + gen[req] + trees.depth
        pred = torch.where(
            idx < self.out_hi[prompt][req], tr.output_tokens[idx.clamp(max=tr.output_tokens.numel() - 1)], -1
        )
        vr = greedy_verify(trees, pred)
        acc = vr.accept_len
        sizes = trees.sizes
        res.accept_len.append(torch.where(active, acc, -1))
        res.tree_size.append(torch.where(active, sizes, 0))
        res.verified_total.append(int(sizes.sum()))
        a = self.true_len[tree.clamp(min=0)]
        depth = self.policy.max_depth
        res.oracle_kmax.append(oracle_accepted(a, active, self.k_max, depth))
        res.oracle_matched.append(oracle_accepted(a, active, int(sizes.sum()), depth))
        res.ranked_kmax.append(self.ranked.accepted(tree, self.k_max))
        res.draft_calls.append(self.drafter.propose_shapes[n_calls:])
        res.catch_up.append((int(active.numel()), int(torch.where(active, acc + 1, 0).max()) if active.any() else 0))
        return acc


def replay_offline(
    trace: Trace,
    policy: TreePolicy,
    prompts: Sequence[int],
    *,
    k_max: int,
    max_new: Optional[int] = None,
    eos_id: Optional[int] = None,
    drafter: Optional[RecordedDrafter] = None,
) -> ReplayResult:
    """Replay :func:`speculative_generate` on trace prompts ``prompts`` as one fixed batch."""
    rp = _Replayer(trace, policy, drafter, k_max)
    B = len(prompts)
    prompt = torch.tensor(list(prompts), dtype=torch.int64)
    length = torch.tensor([trace.stream_length(p, max_new, eos_id) for p in prompts], dtype=torch.int64)
    gen = torch.ones(B, dtype=torch.int64)  # o_0 comes from the prefill
    res = ReplayResult(policy.name, B, k_max)
    while bool((gen < length).any()):
        active = gen < length
        roots = trace.output_tokens[trace.output_indptr[prompt] + gen - 1]
        acc = rp.step(res, prompt, gen, active, roots)
        new = torch.where(active, (acc + 1).minimum(length - gen), 0)
        res.committed.append(int(new.sum()))
        gen = gen + new
        res.streams_finished += int((active & (gen >= length)).sum())
    res.coverage = rp.drafter.coverage
    return res


def replay_serving(
    trace: Trace,
    policy: TreePolicy,
    batch_size: int,
    *,
    k_max: int,
    max_new: Optional[int] = None,
    eos_id: Optional[int] = None,
    min_tokens: Optional[int] = None,
    min_steps: int = 32,
    max_steps: int = 100_000,
    drafter: Optional[RecordedDrafter] = None,
) -> ReplayResult:
    """Continuous batching at concurrency ``batch_size`` (see the module docstring)."""
    rp = _Replayer(trace, policy, drafter, k_max)
    P, B = trace.num_prompts, batch_size
    lengths = torch.tensor([trace.stream_length(p, max_new, eos_id) for p in range(P)], dtype=torch.int64)
    if P == 0 or int(lengths.max()) < 2:
        raise ValueError("the trace has no stream with a speculative step")
    # Default: one pass over the trace (every stream's tokens after its prefill token).
    min_tokens = int((lengths - 1).sum()) if min_tokens is None else min_tokens
    # Slot j starts stream j mod P; its c-th copy starts c/copies of the way into the stream.
    copies = math.ceil(B / P)
    prompt = torch.arange(B) % P
    c = torch.arange(B) // P
    gen = 1 + (c * (lengths[prompt] - 1)) // copies
    next_stream = B
    res = ReplayResult(policy.name, B, k_max)
    active = torch.ones(B, dtype=torch.bool)
    while (sum(res.committed) < min_tokens or res.steps < min_steps) and res.steps < max_steps:
        # A stream with nothing left to draft (length 1) is skipped by refilling at once.
        done = gen >= lengths[prompt]
        while bool(done.any()):
            for j in done.nonzero().flatten().tolist():
                prompt[j], gen[j] = next_stream % P, 1
                next_stream += 1
            done = gen >= lengths[prompt]
        roots = trace.output_tokens[trace.output_indptr[prompt] + gen - 1]
        acc = rp.step(res, prompt, gen, active, roots)
        new = (acc + 1).minimum(lengths[prompt] - gen)
        res.committed.append(int(new.sum()))
        gen = gen + new
        res.streams_finished += int((gen >= lengths[prompt]).sum())
    res.coverage = rp.drafter.coverage
    return res
