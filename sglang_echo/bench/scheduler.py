"""`echo-bench scheduler`: the cost of ECHO's control plane per speculative step.

Times gating + scheduling + packing (and, separately, verification bookkeeping) for one batch,
excluding the drafter: the synthetic drafter's own time is measured around each ``propose`` call
and subtracted, so the figure is what the policy adds to a real step.

It also counts, in one more step, the control plane's tensor ops (those that launch a GPU kernel:
no views, no wrapped Python scalars) and host syncs
(``_local_scalar_dense`` and ``nonzero``: ``int(t)``, ``bool(t)``, boolean-mask indexing). On a
GPU each op is a kernel launch and each sync drains the launch queue, so these two counts predict
the control plane's GPU cost on any machine.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..cli_args import Parser, at_least, check_device, count, positive_int, run
from ..cli_args import device as device_arg
from ..core import PolicyConfig, build_trees, greedy_verify, make_policy, pack
from ..core.synthetic import SyntheticDrafter, SyntheticWorld

_aten = torch.ops.aten
SYNC_OPS = (_aten._local_scalar_dense, _aten.nonzero)  # a device -> host read each
ALLOCATIONS = (_aten.empty, _aten.empty_strided, _aten.empty_like)  # memory only, no kernel


class OpCounter(TorchDispatchMode):
    """Counts the tensor ops and host syncs run under it. Ops that launch nothing on a GPU are
    left out: views, uninitialised allocations (``torch.empty``), and the 0-dim CPU tensors that
    wrap Python scalars (``torch.where(m, x, 0)``: the kernel reads the scalar as an argument)."""

    def __init__(self):
        super().__init__()
        self.ops = self.syncs = 0
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            wrapped_scalar = (
                func is _aten.scalar_tensor.default and torch.device((kwargs or {}).get("device", "cpu")).type == "cpu"
            )
            self.ops += not (func.is_view or wrapped_scalar or func.overloadpacket in ALLOCATIONS)
            self.syncs += func.overloadpacket in SYNC_OPS
        return func(*args, **(kwargs or {}))


class TimedDrafter:
    """Times (and counts) the drafter's calls, so benchmarks can subtract them from a step."""

    def __init__(self, inner: SyntheticDrafter, sync):
        self.inner, self.sync, self.seconds, self.calls = inner, sync, 0.0, 0
        self.counter: OpCounter | None = None  # paused while the drafter runs

    def propose(self, frontier, k):
        if self.counter is not None:
            self.counter.paused = True
        self.sync()
        t0 = time.perf_counter()
        out = self.inner.propose(frontier, k)
        self.sync()
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        if self.counter is not None:
            self.counter.paused = False
        return out


@dataclass
class Step:
    """One synthetic batch, ready for :meth:`control_plane`."""

    world: SyntheticWorld
    drafter: TimedDrafter
    roots: torch.Tensor
    prefix: torch.Tensor
    policy: object

    @classmethod
    def make(
        cls, name: str, cfg: PolicyConfig, batch: int, vocab: int, seed: int, device: torch.device, sync
    ) -> "Step":
        world = SyntheticWorld(batch, vocab=vocab, seed=seed, device=device)
        roots = torch.randint(0, vocab, (batch,), generator=torch.Generator().manual_seed(seed)).to(device)
        prefix = torch.randint(16, 2048, (batch,), generator=torch.Generator().manual_seed(seed + 1)).to(device)
        return cls(world, TimedDrafter(SyntheticDrafter(world), sync), roots, prefix, make_policy(name, cfg))

    def control_plane(self):
        """Gating + scheduling (the drafter's own time is measured apart) + packing."""
        trees, _ = build_trees(self.policy, self.drafter, self.roots)
        return trees, pack(trees, self.prefix)


def count_control_ops(step: Step) -> tuple[int, int]:
    """(tensor ops, host syncs) of one step's control plane, drafter excluded."""
    counter = step.drafter.counter = OpCounter()
    with counter:
        step.control_plane()
    return counter.ops, counter.syncs


@dataclass
class Timing:
    policy: str
    control_ms: list[float]
    verify_ms: list[float]
    verified_tokens: float
    ops: int = 0  # tensor ops of one step's control plane that launch a kernel on a GPU (OpCounter)
    syncs: int = 0  # host syncs among them

    def row(self) -> str:
        (cm, cp), (vm, vp) = median_p99(self.control_ms), median_p99(self.verify_ms)
        return (
            f"{self.policy:<34} {cm:8.2f} {cp:8.2f} {vm:8.2f} {vp:8.2f} {self.verified_tokens:10.0f} "
            f"{self.ops:6d} {self.syncs:6d}"
        )


def time_policy(
    name: str,
    cfg: PolicyConfig,
    batch: int,
    steps: int,
    warmup: int,
    vocab: int,
    device: torch.device = torch.device("cpu"),
) -> Timing:
    # On a GPU every section ends with a synchronize: host syncs inside the policy (per-depth
    # budget reads) are part of its cost, queued kernels must not leak into the next section.
    sync = device_sync(device)
    control, verify, verified = [], [], []
    for seed in range(warmup + steps):
        step = Step.make(name, cfg, batch, vocab, seed, device, sync)
        sync()
        t0 = time.perf_counter()
        trees, _ = step.control_plane()
        sync()
        t1 = time.perf_counter()
        pred = step.world.target_argmax(trees)  # the target's output: not part of the control plane
        sync()
        t2 = time.perf_counter()
        greedy_verify(trees, pred)
        sync()
        t3 = time.perf_counter()
        if seed >= warmup:
            control.append((t1 - t0 - step.drafter.seconds) * 1e3)
            verify.append((t3 - t2) * 1e3)
            verified.append(trees.num_nodes)
    ops, syncs = count_control_ops(Step.make(name, cfg, batch, vocab, warmup + steps, device, sync))
    return Timing(step.policy.name, control, verify, statistics.mean(verified), ops, syncs)


def bench_cases(batch: int) -> list[tuple[str, PolicyConfig]]:
    """The policies and shapes every control-plane table reports (ECHO at K_max = 4B and 8B)."""
    return [
        ("echo", PolicyConfig(k_max=4 * batch, max_depth=8, w_def=1, w_max=4)),
        ("echo", PolicyConfig(k_max=8 * batch, max_depth=8, w_def=2, w_max=8)),
        ("dense-gating", PolicyConfig(k_max=4 * batch, max_depth=8, w_def=1, w_max=4)),
        ("budgeted-chain", PolicyConfig(k_max=4 * batch, max_depth=8)),
        ("static-tree", PolicyConfig(max_depth=3, topk=3, total_tokens=5)),
        ("static-tree", PolicyConfig(max_depth=8, topk=10, total_tokens=60)),
    ]


def case_label(name: str, cfg: PolicyConfig) -> str:
    if name in ("echo", "dense-gating", "budgeted-chain"):
        return f"{name} K_max={cfg.k_max} W={cfg.w_def}/{cfg.w_max}"
    return make_policy(name, cfg).name


def device_sync(device: torch.device):
    """A function that waits for ``device`` (a no-op on the CPU)."""
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def median_p99(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs), xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))]


def add_batch_options(ap: Parser, batch: int, steps: int, warmup: int) -> None:
    """The synthetic batch's options, shared with ``echo-bench graphs``."""
    ap.add_argument("--batch", type=positive_int, default=batch, help="requests in the synthetic batch")
    ap.add_argument("--steps", type=positive_int, default=steps, help="timed steps per policy")
    ap.add_argument("--warmup", type=count, default=warmup, help="untimed steps first")
    ap.add_argument("--vocab", type=at_least(2), default=49152, help="SmolLM2's vocabulary size by default")


def parser() -> Parser:
    ap = Parser(prog="echo-bench scheduler", description=__doc__.splitlines()[0])
    add_batch_options(ap, batch=256, steps=50, warmup=5)
    # The control plane is many small tensor ops: intra-op threads only add synchronisation
    # (and collapse when the target model's threads compete for the same cores), so 1 is default.
    ap.add_argument("--threads", type=count, default=1, help="torch intra-op threads (0: torch's default)")
    ap.add_argument(
        "--device", type=device_arg, default="cpu", help="where the policy's tensors live (cuda: as in a GPU server)"
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    check_device(ap, args.device)
    return run(ap.prog, lambda: _bench(args), args.debug)


def _bench(args) -> None:
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    B = args.batch
    where = (
        torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, torch threads {torch.get_num_threads()}"
    )
    print(f"control plane per step, batch {B}, {args.steps} steps, {where}")
    print(
        f"{'policy (K_max / shape)':<34} {'ctl med':>8} {'ctl p99':>8} {'ver med':>8} {'ver p99':>8} "
        f"{'verified':>10} {'ops':>6} {'syncs':>6}"
    )
    for name, cfg in bench_cases(B):
        t = time_policy(name, cfg, B, args.steps, args.warmup, args.vocab, device)
        t.policy = case_label(name, cfg)
        print(t.row(), flush=True)
    print("ctl = gating + scheduling + packing (drafter excluded); ver = greedy tree verification; ms;")
    print(
        "ops / syncs = tensor ops (no views or wrapped scalars) / host syncs of one step's control plane "
        "(GPU launches / stalls)"
    )
