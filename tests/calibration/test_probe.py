"""The probe's pieces: the beam tree, per-depth profiles, the recorder's FIFO, reading samples, the knee."""

import json

import numpy as np
import pytest
import torch

from sglang_echo.calibration.probe import ProbeRecorder, depth_profile, read_samples
from sglang_echo.calibration.stats import verify_cost_knee
from sglang_echo.core import PolicyConfig, build_trees, make_policy
from sglang_echo.core.synthetic import SyntheticDrafter, SyntheticWorld

from ..core.test_scheduler import TableDrafter, tree_shape
from ..core.trees import assert_well_formed


def test_beam_tree_verifies_every_depth_width_wide():
    world = SyntheticWorld(3, vocab=300, seed=1)
    policy = make_policy("beam-tree", PolicyConfig(max_depth=5, topk=3))
    trees, state = build_trees(policy, SyntheticDrafter(world), torch.tensor([1, 2, 3]))
    assert_well_formed(trees)
    for i in range(3):
        assert tree_shape(trees, i) == [1, 3, 3, 3, 3, 3]
    # The kept beam at each depth is the best `width` of that depth's candidates.
    conf, _ = depth_profile(state.pool, 5)
    for i in range(3):
        lo, hi = int(trees.indptr[i]), int(trees.indptr[i + 1])
        for d in range(1, 6):
            kept = trees.path_score[lo:hi][trees.depth[lo:hi] == d]
            assert conf[i, d - 1].item() == pytest.approx(kept.max().exp().item(), rel=1e-6)


def test_depth_profile_hand_computed():
    # Depth 1: children .7/.3 of the root; depth 2: the .7 node's children .9/.1 (path .63 / .07),
    # the .3 node's are penalised by exp(-10) in TableDrafter.
    _, state = build_trees(
        make_policy("beam-tree", PolicyConfig(max_depth=2, topk=2)), TableDrafter([[0.7, 0.9]], 2), torch.tensor([0])
    )
    conf, top1 = depth_profile(state.pool, 2)
    assert conf[0].tolist() == pytest.approx([0.7, 0.63], rel=1e-5)
    assert top1[0].tolist() == pytest.approx([0.7, 0.9], rel=1e-5)
    # A depth nobody drafted has confidence 0 (and so never passes a gate).
    conf3, _ = depth_profile(state.pool, 3)
    assert conf3[0, 2].item() == 0.0


def test_recorder_pairs_steps_with_accepts_in_order_and_drops_mismatches(tmp_path):
    _, state = build_trees(
        make_policy("beam-tree", PolicyConfig(max_depth=2, topk=2)),
        TableDrafter([[0.7, 0.9], [0.5, 0.5]], 2),
        torch.tensor([0, 1]),
    )
    rec = ProbeRecorder(tmp_path / "s.jsonl")
    rec.on_draft(state.pool, 2, rids=["a", "b"], positions=[17, 40])  # step 1 (bs 2) ...
    rec.on_verify(10, 0.5)
    rec.on_draft(state.pool, 2)  # ... step 2 drafted before step 1's accepts arrive (overlap)
    rec.on_accept([2, 0])  # -> step 1
    rec.on_accept([1])  # step 2 had 2 requests: dropped, not mislabelled
    assert (rec.steps, rec.dropped) == (1, 1)
    s = read_samples(tmp_path / "s.jsonl")
    assert s.num_samples == 2 and s.depth == 2
    assert s.accepted_len.tolist() == [2, 0]
    assert s.labels(1).tolist() == [True, False] and s.labels(2).tolist() == [True, False]
    assert s.verify_tokens.tolist() == [10] and s.verify_s.tolist() == [0.5]
    row = json.loads((tmp_path / "s.jsonl").read_text().splitlines()[0])
    assert row["rid"] == ["a", "b"] and row["pos"] == [17, 40]  # each sample names its request and position


def test_read_samples_skips_a_torn_last_line_but_not_a_bad_middle_one(tmp_path):
    row = json.dumps({"conf": [[0.5]], "top1": [[0.5]], "accepted": [1]})
    p = tmp_path / "s.jsonl"
    p.write_text(row + "\n" + row + "\n" + row[:10])
    assert read_samples(p).num_samples == 2
    p.write_text(row + "\n" + row[:10] + "\n" + row + "\n")
    with pytest.raises(ValueError, match=":2: not a probe sample line"):
        read_samples(p)
    p.write_text("")
    with pytest.raises(ValueError, match="no probe samples"):
        read_samples(p)


def test_knee_is_the_last_count_within_the_slack():
    tokens = np.array([10, 10, 20, 20, 40, 40, 80, 80])
    secs = np.array([1.0, 1.1, 1.1, 1.2, 1.2, 1.3, 2.5, 2.6])  # medians 1.05, 1.15, 1.25, 2.55
    knee, curve = verify_cost_knee(tokens, secs, slack=0.25, warmup=0, min_steps=2)
    assert knee == 40 and [n for n, _, _ in curve] == [10, 20, 40, 80]
    assert verify_cost_knee(tokens, secs, slack=0.05, warmup=0, min_steps=2)[0] == 10
    assert verify_cost_knee(np.array([10, 10]), np.array([1.0, 1.0]), warmup=0)[0] is None
    # Slow first passes (warm-up) and counts seen once do not move the knee.
    slow_start = np.concatenate([[10, 10], tokens, [30]]), np.concatenate([[9.0, 9.0], secs, [1.0]])
    assert verify_cost_knee(*slow_start, warmup=2, min_steps=2)[0] == 40
