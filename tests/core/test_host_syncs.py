"""The control plane's host syncs stay bounded: one "is any request still active?" per depth, the
widest tree, the compaction, and (core pack only) the ragged mask's size. On a GPU every sync
drains the launch queue, so a regression here is a GPU slowdown nobody would see on a CPU."""

from __future__ import annotations

import pytest
import torch

from sglang_echo.bench.scheduler import OpCounter, Step, count_control_ops
from sglang_echo.core import PolicyConfig, build_trees
from sglang_echo.core.dense import to_sglang_dense
from sglang_echo.core.factory import POLICIES

CFG = PolicyConfig(k_max=64, max_depth=6, w_def=1, w_max=4, topk=3, total_tokens=12)
FIXED_SYNCS = 3  # widest tree (pad), compaction, ragged tree_mask size


@pytest.mark.parametrize("policy", POLICIES)
def test_core_control_plane_syncs_once_per_depth(policy):
    step = Step.make(policy, CFG, batch=16, vocab=1000, seed=0, device=torch.device("cpu"), sync=lambda: None)
    ops, syncs = count_control_ops(step)
    assert ops > 0
    # +1: the loop checks once more after the last depth.
    assert syncs <= CFG.max_depth + 1 + FIXED_SYNCS, (ops, syncs)


def test_server_path_syncs():
    """build_trees + the padded-dense verify tensors, as EchoDraftWorker.draft runs them."""
    step = Step.make("echo", CFG, batch=16, vocab=1000, seed=1, device=torch.device("cpu"), sync=lambda: None)
    counter = step.drafter.counter = OpCounter()
    with counter:
        trees, _ = build_trees(step.policy, step.drafter, step.roots)
        to_sglang_dense(trees, step.prefix, width=16)
    assert counter.syncs <= CFG.max_depth + 1 + 2, counter.syncs  # no ragged tree_mask here
