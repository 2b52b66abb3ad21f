"""K_max: a fixed cap, or one that grows with the batch on a GPU; a calibration's measured knee
only on the device it was measured on; every step's cap reaches the policy and the cost budget."""

from __future__ import annotations

import torch

from sglang_echo.core import build_trees, make_policy
from sglang_echo.core.budget import CostModelBudget
from sglang_echo.core.factory import PolicyConfig
from sglang_echo.core.kmax import CPU_DEFAULT, GPU_DEFAULT, Device, KMax, resolve_kmax
from sglang_echo.core.synthetic import SyntheticDrafter, SyntheticWorld

H200 = Device("cuda", "NVIDIA H200")
EPYC = Device("cpu", "AMD EPYC 9B14")


def test_a_fixed_cap_is_the_papers_and_a_growing_one_leaves_room_to_draft():
    assert [KMax(64)(b) for b in (1, 64, 256)] == [64, 64, 64]
    assert [GPU_DEFAULT(b) for b in (1, 64, 128, 256)] == [256, 256, 256, 512]
    assert all(GPU_DEFAULT(b) >= 2 * b for b in range(1, 1025))  # a draft per request at any load


def test_configured_beats_measured_beats_default():
    assert resolve_kmax(48, H200, 300, H200) == (KMax(48, 0.0, "configured"), None)
    kmax, note = resolve_kmax(None, H200, 300, H200)
    assert (kmax.flat, kmax.per_request, note) == (300, GPU_DEFAULT.per_request, None)
    kmax, note = resolve_kmax(None, EPYC, 33, EPYC)
    assert (kmax(64), note) == (33, None)  # a CPU's measured cap stays fixed
    assert resolve_kmax(None, EPYC, None) == (CPU_DEFAULT, None)


def test_a_cap_measured_elsewhere_never_sets_this_servers():
    kmax, note = resolve_kmax(None, H200, 33, EPYC)
    assert kmax == GPU_DEFAULT
    assert "measured on cpu: AMD EPYC 9B14, not on this cuda: NVIDIA H200" in note
    kmax, note = resolve_kmax(None, EPYC, 300, None)  # a file that does not say where
    assert kmax == CPU_DEFAULT and "an unrecorded device" in note
    assert resolve_kmax(None, Device("cuda", "NVIDIA H100 80GB HBM3"), 300, H200)[0] == GPU_DEFAULT


def test_device_of_this_cpu_round_trips():
    dev = Device.of("cpu")
    assert dev.kind == "cpu" and dev.name
    assert Device.from_json({"kind": dev.kind, "name": dev.name}) == dev and Device.from_json(None) is None


def test_a_steps_cap_above_the_policys_own_is_spent():
    """build_trees gives the step the server's cap, also where it exceeds the policy's config."""
    batch, cfg = 16, PolicyConfig(k_max=16, max_depth=4, w_def=1, w_max=2)
    world = SyntheticWorld(batch, vocab=500, seed=1)
    roots = torch.randint(0, 500, (batch,), generator=torch.Generator().manual_seed(0))
    policy = make_policy("echo", cfg)
    own, _ = build_trees(policy, SyntheticDrafter(world), roots)
    grown, _ = build_trees(policy, SyntheticDrafter(world), roots, k_max=GPU_DEFAULT(batch))
    assert int(own.sizes.sum()) == batch  # K_max = B: plain decoding
    assert batch < int(grown.sizes.sum()) <= GPU_DEFAULT(batch)


def test_the_cost_budget_explores_under_a_growing_ceiling():
    budget = CostModelBudget(GPU_DEFAULT, max_depth=4, warmup=4)
    caps = [budget.cap(300) for _ in range(3)]
    assert caps == [600] * 3  # warm-up drafts at K_max(300), which leaves room for a draft each
    fixed = CostModelBudget(64, max_depth=4, warmup=4)
    assert fixed.cap(300) == 64  # the roots alone fill a fixed 64: plain
