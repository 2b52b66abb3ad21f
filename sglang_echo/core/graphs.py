"""One step's tree building as CUDA graphs: the control plane without a launch per tensor op.

Eagerly, an ECHO step's control plane (Eq. 6-7 gates, Alg. 1's grants, top-k, the pool appends,
packing) is about 660 small tensor ops. On an H100 each is a kernel launch, so the step costs 8-13
ms whatever the batch: launch-bound.
:class:`GraphedTreeBuilder` captures it once per batch size and then replays it::

    builder = GraphedTreeBuilder(policy, drafter, batch_size=B, width=W, device="cuda")
    padded = builder(roots, prefix_lens)   # PaddedTrees [B, W] (or finish(padded, prefix_lens))

It captures one graph for ``policy.start`` and the first frontier, one per depth for
``policy.advance`` and the next frontier, and one for ``policy.select`` and
:func:`~sglang_echo.core.pack.pad_pool` (plus ``finish``, e.g. sglang's dense verify layout). The
drafter runs eagerly between them, its candidates copied into the graphs' input buffers, as a
drafter's forward (which the engine graph-captures itself) would.

What the graphs need, and why the trees are still those of ``build_trees`` + ``pad_trees``
(``tests/core/test_graphs.py``):

* static shapes and no host syncs inside a graph: every depth's graph runs, and the pool is laid
  out at width ``W`` instead of compacted. Between depths the builder still asks "is any request
  still active?" (one host read, as the eager loop does; ``stop_early=False`` skips it): when none
  is, the drafter is not called and the depth's graph runs on candidates marked invalid, which
  every policy drops, so the trees are the same and the next graphs read a consistent state;
* the drafter returns candidates of the same shape at a given depth on every step (true of every
  drafter here at a fixed batch size), greedy ones (no proposal distributions);
* the policy's own ``K_max`` (a per-step cap would be one more input buffer).

Graphs remove the launches but not the kernels: each of the ~660 ops still runs as its own tiny
kernel of a few microseconds. ``compile="inductor"`` first fuses every stage with
``torch.compile`` (one full graph per stage, no breaks), which merges the elementwise ops but not
the sorts, gathers and scatters. On an H200 an ECHO step took 8-17 ms eagerly, 2.0-3.1 ms as
graphs and 1.4-1.5 ms as fused graphs; compiling took 49-84 s,
once per builder. ECHO and its ablations also have hand-fused stages: with
``control_kernel="triton"`` each depth is one Triton program (:mod:`sglang_echo.kernels.control`),
captured like any other stage and compiled in seconds; ``pad`` and ``finish`` take the fused
layout (:mod:`sglang_echo.kernels.control.layout`), so a step is a few dozen launches, not ~600.

The outputs are the graphs' own buffers: read or copy them before the next call. Without CUDA, or
with ``graphs=False``, the same stages run eagerly; that is how the CPU tests check them.
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import fields
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from .pack import PaddedTrees, pad_pool
from .policy import BuildState, Frontier, TreeDrafter, TreePolicy
from .tree import Candidates, NodePool

Finish = Callable[[PaddedTrees, Tensor], Any]
Pad = Callable[[NodePool, Tensor, int], PaddedTrees]


class GraphedTreeBuilder:
    """``build_trees`` + ``pad_trees`` for a fixed batch size, the policy's work as CUDA graphs."""

    def __init__(
        self,
        policy: TreePolicy,
        drafter: TreeDrafter,
        batch_size: int,
        width: int,
        device: torch.device | str = "cuda",
        finish: Optional[Finish] = None,
        graphs: Optional[bool] = None,
        stop_early: bool = True,
        compile: Optional[str] = None,
        pad: Pad = pad_pool,
    ):
        if type(policy).finish is not TreePolicy.finish:
            raise TypeError(f"{type(policy).__name__} overrides finish(); graphs need its choices in select()")
        self.policy, self.drafter, self.width, self.finish, self.pad = policy, drafter, width, finish, pad
        self.stop_early = stop_early
        self.device = torch.device(device)
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        self.roots = torch.zeros(batch_size, dtype=torch.int64, device=self.device)
        self.prefix_lens = torch.zeros(batch_size, dtype=torch.int64, device=self.device)
        depths = policy.max_depth
        self.state: Optional[BuildState] = None
        self.out: Any = None
        self._cands: list[Optional[Candidates]] = [None] * (depths + 1)  # depth d's input buffer
        self._frontiers: list[Optional[Frontier]] = [None] * (depths + 1)  # after stage d
        self.compile = compile
        # Unbound functions, called with self: bound methods here would make a reference cycle,
        # and a builder freed by the cyclic GC in the middle of another builder's capture destroys
        # its graphs there, which invalidates that capture.
        stages = (type(self)._start, type(self)._advance, type(self)._end)
        if compile:  # the depths recompile _advance: shapes differ by depth (dynamic=False)
            stages = tuple(torch.compile(f, backend=compile, fullgraph=True, dynamic=False) for f in stages)
        self._start_fn, self._advance_fn, self._end_fn = stages
        self._graphs: list[torch.cuda.CUDAGraph] = []

    def __call__(self, roots: Tensor, prefix_lens: Tensor) -> Any:
        self.roots.copy_(roots)
        self.prefix_lens.copy_(prefix_lens)
        with _recompiles(self.compile, self.policy.max_depth + 2):
            if self.graphs and not self._graphs:
                return self._capture()
            return self._step(self.stop_early)

    def _step(self, stop_early: bool) -> Any:
        self._run(0)
        for d in range(1, self.policy.max_depth + 1):
            if stop_early and not bool(self._frontiers[d - 1].active.any()):  # the one host read per depth
                if not self._graphs:
                    break  # eagerly the remaining depths would change nothing
                self._cands[d].valid.fill_(False)
            else:
                self._load(d, self.drafter.propose(self._frontiers[d - 1], self.policy.children_per_node))
            self._run(d)
        self._run(self.policy.max_depth + 1)
        return self.out

    # The stages: each reads the state the previous one left (graph outputs, once captured).
    def _start(self, _: int) -> None:
        self.state = self.policy.start(self.roots)
        self._frontiers[0] = self.state.frontier()

    def _advance(self, d: int) -> None:
        self.policy.advance(self.state, self._cands[d])
        self._frontiers[d] = self.state.frontier()

    def _end(self, _: int) -> None:
        self.policy.select(self.state)
        padded = self.pad(self.state.pool, self.prefix_lens, self.width)
        self.out = self.finish(padded, self.prefix_lens) if self.finish else padded

    def _run(self, stage: int) -> None:
        if self._graphs:
            self._graphs[stage].replay()
        else:
            self._stage_fn(stage)(self, stage)

    def _stage_fn(self, stage: int) -> Callable[["GraphedTreeBuilder", int], None]:
        return self._start_fn if stage == 0 else self._end_fn if stage > self.policy.max_depth else self._advance_fn

    def _load(self, d: int, cands: Candidates) -> None:
        """Depth ``d``'s candidates into its input buffer, made on the first step. Graphs and
        compiled stages always read the same buffers: a compiled stage guards on its inputs'
        strides, and a drafter's strided views would make it recompile during the capture."""
        if cands.proposal_dists is not None:
            raise ValueError("graphed tree building is greedy only: the drafter returned proposal distributions")
        if not (self.graphs or self.compile):  # plain eager stages: the candidates are the input
            self._cands[d] = cands
            return
        if self._cands[d] is None:
            self._cands[d] = _buffer_like(cands)
            return
        dsts, srcs = [], []
        for f in fields(Candidates):
            src, dst = getattr(cands, f.name), getattr(self._cands[d], f.name)
            if (src is None) != (dst is None) or (src is not None and src.shape != dst.shape):
                raise ValueError(
                    f"depth {d}: the drafter's {f.name} changed shape since capture "
                    f"({None if dst is None else tuple(dst.shape)} -> {None if src is None else tuple(src.shape)})"
                )
            if src is not None:
                dsts.append(dst)
                srcs.append(src.to(dst.dtype))
        torch._foreach_copy_(dsts, srcs)  # a few multi-tensor launches on a GPU, not one per field

    def _capture(self) -> Any:
        """First call: one eager step (its result is returned) on a side stream, which warms up
        lazily created CUDA state and fixes every depth's candidate shapes; then the capture,
        every stage into one memory pool, replayed in capture order ever after."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            out = self._step(stop_early=False)  # every depth's candidates, to make its buffer
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.out = None
        pool = torch.cuda.graph_pool_handle()
        graphs = []
        # No garbage collection during the capture: freeing dead graphs (an earlier builder's) is a
        # CUDA call that invalidates a capture in progress, so they go now or after it.
        gc.collect()
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:  # compiling inside a capture fails obscurely (Inductor runs kernels): say which guard failed
            with torch._dynamo.config.patch(error_on_recompile=True):
                for stage in range(self.policy.max_depth + 2):
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        self._run(stage)
                    graphs.append(graph)
        finally:
            if gc_was_enabled:
                gc.enable()
        self._graphs = graphs
        return out


def _buffer_like(cands: Candidates) -> Candidates:
    return Candidates(
        **{f.name: None if (t := getattr(cands, f.name)) is None else t.clone() for f in fields(Candidates)}
    )


def _recompiles(compile: Optional[str], stages: int):
    """Room for one compiled variant per stage: the depths share ``_advance``'s code object, so
    each depth (and each builder) is a recompile of it as far as torch.compile counts."""
    if not compile:
        return contextlib.nullcontext()
    return torch._dynamo.config.patch(
        recompile_limit=max(torch._dynamo.config.recompile_limit, 8 * stages),
        accumulated_recompile_limit=max(torch._dynamo.config.accumulated_recompile_limit, 64 * stages),
    )
