"""Kernel launches per ECHO step of the GPU server's control plane, eager vs the fused Triton path.

Counts, on any machine, what a captured step replays: every torch op that launches a GPU kernel
(:class:`~sglang_echo.bench.scheduler.OpCounter`) and every Triton program. The step is
:class:`~sglang_echo.core.graphs.GraphedTreeBuilder`'s stages run eagerly with every depth drafted
(what its graphs hold, plus the copies of each depth's candidates into the graphs' input buffers,
one multi-tensor copy), drafter excluded, batch 256:

    python benchmarks/control_launches.py [--batch 256]

Without CUDA the Triton kernels run under the interpreter (set here before they are imported).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")

from sglang_echo.bench.scheduler import OpCounter, TimedDrafter  # noqa: E402
from sglang_echo.core import PolicyConfig, make_policy  # noqa: E402
from sglang_echo.core.dense import dense_from_padded  # noqa: E402
from sglang_echo.core.factory import max_tree_size  # noqa: E402
from sglang_echo.core.graphs import GraphedTreeBuilder  # noqa: E402
from sglang_echo.core.synthetic import SyntheticDrafter, SyntheticWorld  # noqa: E402
from sglang_echo.kernels.control import elastic, layout  # noqa: E402

COUNTER = OpCounter()
COUNTER.programs = 0  # Triton programs launched under it (their insides are not torch ops)


class _Launch:
    """A Triton kernel whose launches are counted."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            COUNTER.paused, paused = True, COUNTER.paused
            COUNTER.programs += 1
            try:
                return launch(*args, **kwargs)
            finally:
                COUNTER.paused = paused

        return run


for module, name in (
    (elastic, "_elastic_depth_kernel"),
    (elastic, "_elastic_select_kernel"),
    (layout, "_pad_pool_kernel"),
    (layout, "_dense_kernel"),
):
    setattr(module, name, _Launch(getattr(module, name)))


def count(name: str, cfg: PolicyConfig, batch: int, fused: bool, device: str) -> tuple[int, int, int]:
    world = SyntheticWorld(batch, vocab=49152, seed=0, device=device)
    policy = make_policy(name, replace(cfg, control_kernel="triton" if fused else "torch"))
    kw = dict(pad=layout.pad_pool, finish=layout.dense_from_padded) if fused else dict(finish=dense_from_padded)
    # graphs=True on any device: the stages run eagerly here (_step, no capture), but the candidates
    # go through the graphs' input buffers as they would around a replay, and those copies count.
    drafter = TimedDrafter(SyntheticDrafter(world), sync=lambda: None)
    drafter.counter = COUNTER  # paused while the drafter runs
    builder = GraphedTreeBuilder(policy, drafter, batch, max_tree_size(name, cfg), device, graphs=True, **kw)
    g = torch.Generator().manual_seed(45)
    builder.roots.copy_(torch.randint(0, 49152, (batch,), generator=g))
    builder.prefix_lens.copy_(torch.randint(16, 2048, (batch,), generator=g))
    builder._step(stop_early=False)  # the first step makes the buffers
    COUNTER.ops = COUNTER.syncs = COUNTER.programs = 0
    with COUNTER:
        builder._step(stop_early=False)
    return COUNTER.ops, COUNTER.programs, COUNTER.syncs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    B = args.batch
    print(f"launches per step (every depth drafted), batch {B}, {args.device}")
    print(f"{'policy':<28}{'eager ops':>11}{'fused ops':>11}{'+ programs':>12}{'ratio':>8}{'syncs':>7}")
    for name, cfg in (
        ("echo", PolicyConfig(k_max=4 * B, max_depth=8, w_def=1, w_max=4)),
        ("echo", PolicyConfig(k_max=8 * B, max_depth=8, w_def=2, w_max=8)),
        ("dense-gating", PolicyConfig(k_max=4 * B, max_depth=8, w_def=1, w_max=4)),
    ):
        eager, _, _ = count(name, cfg, B, False, args.device)
        ops, programs, syncs = count(name, cfg, B, True, args.device)
        label = f"{name} K_max={cfg.k_max // B}B W={cfg.w_def}/{cfg.w_max}"
        print(f"{label:<28}{eager:>11}{ops:>11}{programs:>12}{eager / (ops + programs):>7.1f}x{syncs:>7}")


if __name__ == "__main__":
    main()
