"""Padding invariants of the padded-dense verify input (memo 7.2), and that every core policy's
trees fit the verify width the plugin configures, within the K_max budget."""

from __future__ import annotations

import pytest
import torch

from sglang_echo.core.dense import plain_dense, to_sglang_dense
from sglang_echo.core.factory import POLICIES
from sglang_echo.core.policy import build_trees
from sglang_echo.core.synthetic import SyntheticDrafter, SyntheticWorld
from sglang_echo.integration.config import load_config, make_echo_policy


def _trees(policy_name: str, B: int = 6, k_max: int = 20, seed: int = 0, **env):
    env = {"SGLANG_ECHO_POLICY": policy_name, "SGLANG_ECHO_K_MAX": str(k_max), **env}
    cfg = load_config(environ=env)
    policy = make_echo_policy(cfg)
    world = SyntheticWorld(B, seed=seed)
    trees, _ = build_trees(policy, SyntheticDrafter(world), torch.arange(B) + 7)
    return cfg, policy, trees


def _reachable(next_token: torch.Tensor, next_sibling: torch.Tensor) -> torch.Tensor:
    B, W = next_token.shape
    seen = torch.zeros(B, W, dtype=torch.bool)
    for b in range(B):
        stack = [0]
        while stack:
            j = stack.pop()
            if seen[b, j]:
                continue
            seen[b, j] = True
            for nxt in (int(next_token[b, j]), int(next_sibling[b, j])):
                if nxt >= 0:
                    stack.append(nxt)
    return seen


@pytest.mark.parametrize("name", ["echo", "chain", "static-tree", "budgeted-chain"])
def test_padding_invariants(name):
    cfg, _, trees = _trees(name, SGLANG_ECHO_CALIBRATION="", SGLANG_ECHO_CONFIG='{"fixed_tau": 0.0}')
    B, W = trees.batch_size, cfg.resolved_width()
    seq_lens = torch.tensor([5, 9, 3, 12, 7, 4])
    d = to_sglang_dense(trees, seq_lens, W)
    K = trees.sizes
    valid = torch.arange(W)[None, :] < K[:, None]
    assert torch.equal(d.valid, valid)  # real nodes occupy slots [0, K_b)
    assert torch.equal(d.sizes, K.to(torch.int32))
    # retrieve_index is the global flat id b*W + j everywhere, padding included.
    assert torch.equal(d.retrieve_index, torch.arange(B * W).view(B, W))
    pad = ~valid
    # padding: no links, unreachable from the root; every real node reachable.
    assert (d.retrieve_next_token[pad] == -1).all() and (d.retrieve_next_sibling[pad] == -1).all()
    assert torch.equal(_reachable(d.retrieve_next_token, d.retrieve_next_sibling), valid)
    # mask: padding rows are diagonal-only; no real row sees a padding column.
    eye = torch.eye(W, dtype=torch.bool)
    for b in range(B):
        m = d.tree_mask[b]
        for j in range(W):
            if pad[b, j]:
                assert torch.equal(m[j], eye[j])
            assert not (m[j] & pad[b] & ~eye[j]).any()
        assert m.diagonal().all()  # never an all-false row
    # QLEN_ONLY layout is the [B, W, W] block flattened.
    assert torch.equal(d.custom_mask, d.tree_mask.flatten())
    # padding token = root, position = seq_len (depth 0); real positions = seq_len + depth.
    tok, pos = d.draft_token.view(B, W), d.positions.view(B, W)
    roots = trees.tokens[trees.indptr[:-1]]
    assert torch.equal(tok[:, 0], roots)
    assert (tok[pad] == roots[:, None].expand(B, W)[pad]).all()
    assert (pos[pad] == seq_lens[:, None].expand(B, W)[pad]).all()
    assert torch.equal(pos[valid], seq_lens[trees.request_of_node] + trees.depth)


def test_full_mask_layout():
    cfg, _, trees = _trees("echo", B=3)
    W = cfg.resolved_width()
    seq_lens = torch.tensor([2, 5, 1])
    d = to_sglang_dense(trees, seq_lens, W, full_mask=True)
    assert d.custom_mask.numel() == int(seq_lens.sum()) * W + W * W * 3
    off = 0
    for b, L in enumerate(seq_lens.tolist()):
        block = d.custom_mask[off : off + W * (L + W)].view(W, L + W)
        assert block[:, :L].all() and torch.equal(block[:, L:], d.tree_mask[b])
        off += W * (L + W)


@pytest.mark.parametrize("full_mask", [False, True])
def test_plain_dense_is_the_root_only_layout(full_mask):
    """A step capped at its roots builds its width-1 layout directly: it must be exactly what the
    trees the policy builds under that cap pack into."""
    B = 5
    cfg = load_config(environ={"SGLANG_ECHO_POLICY": "echo", "SGLANG_ECHO_K_MAX": "64"})
    roots = torch.arange(B) + 7
    trees, _ = build_trees(make_echo_policy(cfg), SyntheticDrafter(SyntheticWorld(B)), roots, k_max=B)
    assert trees.sizes.tolist() == [1] * B
    seq_lens = torch.tensor([5, 9, 3, 12, 7])
    want, got = to_sglang_dense(trees, seq_lens, 1, full_mask=full_mask), plain_dense(roots, seq_lens, full_mask)
    for name in want.__dataclass_fields__:
        a, b = getattr(want, name), getattr(got, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name


def test_padding_is_never_accepted():
    """sglang's greedy tree acceptance (CPU op) on a padded batch equals the unpadded tree's."""
    from sglang_echo.platform.ops.spec_accept import verify_tree_greedy_cpu

    cfg, _, trees = _trees("echo", B=4, SGLANG_ECHO_CONFIG='{"policy": "fixed-threshold", "fixed_tau": 0.0}')
    B, W = trees.batch_size, cfg.resolved_width()
    d = to_sglang_dense(trees, torch.full((B,), 4), W)
    cand = d.draft_token.view(B, W)
    # A target that agrees with every draft token, padding included (worst case for padding).
    target = torch.zeros(B, W, dtype=torch.int64)
    for b in range(B):
        lo = int(trees.indptr[b])
        for j in range(int(trees.sizes[b])):
            p = int(trees.parents[lo + j])
            if p >= 0:
                target[b, p] = cand[b, j]
    depth = cfg.max_depth + 1
    predicts = torch.zeros(B * W, dtype=torch.int32)
    accept_index = torch.full((B, depth), -1, dtype=torch.int64)
    accept_num = torch.zeros(B, dtype=torch.int32)
    verify_tree_greedy_cpu(
        predicts,
        accept_index,
        accept_num,
        cand,
        d.retrieve_index,
        d.retrieve_next_token,
        d.retrieve_next_sibling,
        target,
    )
    for b in range(B):
        acc = accept_index[b][accept_index[b] >= 0] - b * W
        assert (acc < trees.sizes[b]).all()  # only real nodes
    assert (accept_num >= 0).all()


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("B", [1, 5, 16])
def test_every_policy_fits_width_and_budget(name, B):
    k_max = 12
    cfg, policy, trees = _trees(name, B=B, k_max=k_max, SGLANG_ECHO_CONFIG='{"fixed_tau": 0.01}')
    assert int(trees.sizes.max()) <= cfg.resolved_width()
    if policy.budgeted:
        assert int(trees.sizes.sum()) <= max(k_max, B)
