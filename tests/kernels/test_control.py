"""The fused control kernels (:mod:`sglang_echo.kernels.control`) do exactly what the torch code
does: the elastic kernels build the eager policy's trees, frontiers, gate counts, budget and
widening (ECHO and its ablations, ties included, SmolLM2 with its EAGLE-3 head too), the layout
kernels lay any policy's pool out as ``pad_pool`` and ``dense_from_padded`` do. On the CPU they
run under ``TRITON_INTERPRET=1`` (conftest) and are compiled for sm_90 in a subprocess; on a GPU
(``-m gpu``) they are also replayed as CUDA graphs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch

from sglang_echo.core import PolicyConfig, build_trees, make_policy
from sglang_echo.core.dense import DenseVerifyTensors, dense_from_padded, to_sglang_dense
from sglang_echo.core.factory import ELASTIC_POLICIES, POLICIES, max_tree_size
from sglang_echo.core.graphs import GraphedTreeBuilder
from sglang_echo.core.pack import pad_pool
from sglang_echo.core.synthetic import SyntheticDrafter, SyntheticWorld
from sglang_echo.core.tree import DraftTrees
from sglang_echo.kernels.control import TRITON, layout

from .control_cases import poison_, poisoned_empty, same

VOCAB = 3000
# Compiled Triton needs CUDA tensors; the interpreter (conftest, no CUDA) runs on CPU tensors.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class Coarse(SyntheticDrafter):
    """Log-probabilities rounded to halves: many equal path scores and confidences, so the
    kernels' order must break ties as the eager stable sorts do."""

    def propose(self, frontier, k):
        cands = super().propose(frontier, k)
        return replace(cands, logprob=(cands.logprob * 2).round() / 2)


class Labelled(SyntheticDrafter):
    """Candidates that carry drafter ids and (greedy) proposal rows, which the pool must store."""

    def propose(self, frontier, k):
        cands = super().propose(frontier, k)
        return replace(cands, drafter=cands.tokens % 3, proposal=torch.full_like(cands.tokens, -1))


class Sampled(SyntheticDrafter):
    """Candidates with proposal distributions (temperature > 0): the fused path defers to eager."""

    def propose(self, frontier, k):
        cands = super().propose(frontier, k)
        B, C = cands.tokens.shape
        rows = torch.arange(B * C, device=cands.tokens.device).reshape(B, C)
        return replace(cands, proposal=rows, proposal_dists=torch.full((B * C, 8), 0.125, device=rows.device))


def build(name, cfg, drafter, roots, kernel, k_max=None):
    seen = []  # every frontier the drafter is handed (the kernel writes its tokens and path scores)
    propose = drafter.propose
    drafter.propose = lambda frontier, k: seen.append(frontier) or propose(frontier, k)
    trees, state = build_trees(
        make_policy(name, replace(cfg, control_kernel=kernel), fused=TRITON), drafter, roots, k_max
    )
    state.extra["frontiers"] = seen
    return trees, state


def assert_same_step(eager, fused):
    (t0, s0), (t1, s1) = eager, fused
    for f in fields(DraftTrees):
        a, b = getattr(t0, f.name), getattr(t1, f.name)
        assert (a is None and b is None) or same(a, b), f.name
    assert torch.equal(s0.gate_evaluated, s1.gate_evaluated)
    assert torch.equal(s0.gate_passed, s1.gate_passed)
    assert int(s0.budget) == int(s1.budget)
    assert torch.equal(s0.extra["widened"], s1.extra["widened"])
    assert len(s0.extra["frontiers"]) == len(s1.extra["frontiers"])
    for f0, f1 in zip(s0.extra["frontiers"], s1.extra["frontiers"]):
        for name in ("slots", "source", "tokens", "path_score", "active"):
            assert same(getattr(f0, name), getattr(f1, name)), name


def roots_for(batch, seed, device=DEVICE):
    return torch.randint(0, VOCAB, (batch,), generator=torch.Generator().manual_seed(seed)).to(device)


@pytest.mark.parametrize("name", ELASTIC_POLICIES)
@pytest.mark.parametrize(
    "batch, k_per_request, w_def, w_max",
    [
        (24, 5, 1, 4),  # some requests truncated and widened
        (70, 3, 2, 4),  # more rows than one chunk of the grant sum, not a power of two, W_def narrowed to 1
        (16, 9, 2, 8),  # a loose budget: depth everywhere, wide widening
        (8, 30, 2, 4),  # a budget share of 4.8 per request and depth: W_def 2 granted
        (10, 0.5, 1, 4),  # K_max < B: plain decoding, nothing drafted
        (1, 6, 1, 4),  # one request
        (12, 4, 1, 3),  # W_max not a power of two
    ],
)
@pytest.mark.parametrize("drafter", [SyntheticDrafter, Coarse])
def test_fused_policy_equals_eager(name, batch, k_per_request, w_def, w_max, drafter):
    cfg = PolicyConfig(k_max=max(int(k_per_request * batch), 1), max_depth=6, w_def=w_def, w_max=w_max)
    world = SyntheticWorld(batch, vocab=VOCAB, seed=batch, device=DEVICE)
    for seed in range(2):
        roots = roots_for(batch, seed)
        eager = build(name, cfg, drafter(world), roots, "torch")
        assert_same_step(eager, build(name, cfg, drafter(world), roots, "triton"))


# Batches around the grant sum's 32-row chunks and the kernels' warp counts (8 up to 256, then 16).
POISON_BATCHES = (1, 31, 33, 65, 257) if DEVICE == "cuda" else (1, 33, 65)


@pytest.mark.parametrize("name", ELASTIC_POLICIES)
@pytest.mark.parametrize("batch", POISON_BATCHES)
def test_fused_policy_writes_every_cell(name, batch, monkeypatch):
    """Every ``torch.empty`` of the fused build poisoned (the preallocated pool's columns, the
    kernels' frontiers, flags and budget): the trees and frontiers still equal the eager ones."""
    cfg = PolicyConfig(k_max=3 * batch, max_depth=5, w_def=2, w_max=4)
    world = SyntheticWorld(batch, vocab=VOCAB, seed=batch + 11, device=DEVICE)
    roots = roots_for(batch, 1)
    eager = build(name, cfg, Coarse(world), roots, "torch")
    with poisoned_empty(monkeypatch):
        fused = build(name, cfg, Coarse(world), roots, "triton")
    assert_same_step(eager, fused)


def test_drafter_ids_and_proposal_rows_reach_the_pool():
    batch, cfg = 20, PolicyConfig(k_max=100, max_depth=6, w_def=2, w_max=4)
    world = SyntheticWorld(batch, vocab=VOCAB, seed=8, device=DEVICE)
    roots = roots_for(batch, 0)
    eager, fused = (build("echo", cfg, Labelled(world), roots, k) for k in ("torch", "triton"))
    assert_same_step(eager, fused)
    assert fused[0].drafter.unique().numel() > 1


def test_per_step_cap_and_sampled_fallback():
    batch = 24
    cfg = PolicyConfig(k_max=6 * batch, max_depth=5)
    world = SyntheticWorld(batch, vocab=VOCAB, seed=3, device=DEVICE)
    roots = roots_for(batch, 0)
    for cap in (batch, 2 * batch, 4 * batch):  # a cost model's per-step cap below the policy's
        assert_same_step(
            build("echo", cfg, Coarse(world), roots, "torch", cap),
            build("echo", cfg, Coarse(world), roots, "triton", cap),
        )
    eager = build("echo", cfg, Sampled(world), roots, "torch")
    fused = build("echo", cfg, Sampled(world), roots, "triton")  # eager depths on the preallocated pool
    assert_same_step(eager, fused)
    assert fused[0].proposal_dists.shape == eager[0].proposal_dists.shape


PADDED = ("tokens", "parents", "depth", "positions", "mask", "valid")


@pytest.mark.parametrize("name", [p for p in POLICIES if p != "ar"])
@pytest.mark.parametrize("extra_width", [0, 5])  # exactly the widest tree, and padding slots
def test_fused_layout_equals_pad_pool_and_dense(name, extra_width):
    """Every policy's pools (chains, wide static trees, widened ECHO trees) lay out the same."""
    batch = 12
    cfg = PolicyConfig(k_max=5 * batch, max_depth=5, topk=3, total_tokens=14)
    world = SyntheticWorld(batch, vocab=VOCAB, seed=6, device=DEVICE)
    width = max_tree_size(name, cfg) + extra_width
    for seed in range(2):
        _, state = build(name, cfg, SyntheticDrafter(world), roots_for(batch, seed), "torch")
        prefix = torch.randint(1, 500, (batch,), generator=torch.Generator().manual_seed(seed)).to(DEVICE)
        ref, out = pad_pool(state.pool, prefix, width), layout.pad_pool(state.pool, prefix, width)
        for f in PADDED:
            assert torch.equal(getattr(out, f), getattr(ref, f)), f
        dense_ref, dense = dense_from_padded(ref, prefix), layout.dense_from_padded(ref, prefix)
        for f in fields(DenseVerifyTensors):
            assert torch.equal(getattr(dense, f.name), getattr(dense_ref, f.name)), f.name


def test_graphed_builder_runs_the_kernels():
    batch = 40
    cfg = PolicyConfig(k_max=4 * batch, max_depth=6, control_kernel="triton")
    world = SyntheticWorld(batch, vocab=VOCAB, seed=4, device=DEVICE)
    width = max_tree_size("echo", cfg)
    fused = GraphedTreeBuilder(
        make_policy("echo", cfg, fused=TRITON),
        Coarse(world),
        batch,
        width,
        DEVICE,
        graphs=False,
        pad=layout.pad_pool,
        finish=layout.dense_from_padded,
    )
    for seed in range(3):
        roots = roots_for(batch, seed)
        prefix = torch.randint(1, 500, (batch,), generator=torch.Generator().manual_seed(seed)).to(DEVICE)
        trees, _ = build("echo", cfg, Coarse(world), roots, "torch")
        out, ref = fused(roots, prefix), to_sglang_dense(trees, prefix, width)
        for f in fields(DenseVerifyTensors):
            assert torch.equal(getattr(out, f.name), getattr(ref, f.name)), f.name


def test_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="unknown control kernel"):
        make_policy("echo", PolicyConfig(control_kernel="cuda"))
    with pytest.raises(ValueError, match="fused=sglang_echo.kernels.control.TRITON"):  # the core never imports kernels
        make_policy("echo", PolicyConfig(control_kernel="triton"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ELASTIC_POLICIES)
@pytest.mark.parametrize("batch, w_def, w_max", [(8, 1, 4), (64, 1, 4), (256, 1, 4), (8, 2, 8), (64, 2, 8)])
def test_cuda_graphs_of_the_kernels_equal_eager(name, batch, w_def, w_max, monkeypatch):
    """ECHO's widths W = 13 (one warp, a 33-slot pool) and 27 (two warps, 129 slots), captured on
    poisoned buffers: every replay writes every cell the eager layout has."""
    cfg = PolicyConfig(k_max=4 * batch, max_depth=8, w_def=w_def, w_max=w_max)
    world = SyntheticWorld(batch, vocab=VOCAB, seed=5, device="cuda")
    width = max_tree_size(name, cfg)
    with poisoned_empty(monkeypatch):
        graphed = GraphedTreeBuilder(
            make_policy(name, replace(cfg, control_kernel="triton"), fused=TRITON),
            Coarse(world),
            batch,
            width,
            "cuda",
            pad=layout.pad_pool,
            finish=layout.dense_from_padded,
        )
        for seed in range(5):  # the first call captures, the rest replay
            roots = roots_for(batch, seed, "cuda")
            prefix = torch.randint(1, 500, (batch,), device="cuda")
            out = graphed(roots, prefix)
            for f in fields(DenseVerifyTensors):  # what a replay leaves unwritten is poison again
                if f.name != "custom_mask":  # a view of tree_mask
                    poison_(getattr(out, f.name))
            out = graphed(roots, prefix)
            trees, _ = build(name, cfg, Coarse(world), roots, "torch")
            ref = to_sglang_dense(trees, prefix, width)
            for f in fields(DenseVerifyTensors):
                assert same(getattr(out, f.name), getattr(ref, f.name)), f.name


def test_kernels_compile_for_hopper_without_spills():
    """Triton's GPU compiler, not the interpreter: every kernel builds for sm_90 (no GPU needed)
    and keeps everything in registers up to batch 256; the layout kernels, at every tile size,
    never convert the register layout of a bool or byte tensor (the conversion Triton 3.6
    miscompiles)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("compile_control.py")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert len(report["usage"]) == 9
    for kernel, line in report["usage"].items():
        assert "STACK:0 " in line and "LOCAL:0 " in line, (kernel, line)
    assert len(report["narrow"]) == 35
    assert not {k: n for k, n in report["narrow"].items() if n}, (report["triton"], report["narrow"])


def test_real_model_with_the_kernels_is_lossless_and_drafts_the_same(smollm2_dir):
    """SmolLM2-135M with the shipped EAGLE-3 head, greedy: the kernels' steps accept exactly what
    the eager policy's do, and the output is plain decoding's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglang_echo.bench.acceptance import build_drafter, load_prompt_ids, shipped_draft
    from sglang_echo.eval import HFTarget, autoregressive_generate, speculative_generate

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir))
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).to(DEVICE)
    drafter, captured = build_drafter("eagle3", shipped_draft(smollm2_dir, "eagle3"), model, torch.device(DEVICE))
    target = HFTarget(model, captured)
    prompts = load_prompt_ids("chat", 4, tokenizer, 48)
    cfg = PolicyConfig(k_max=12, max_depth=6, w_def=1, w_max=4)  # 3 draft tokens a request: gates bind
    ar = autoregressive_generate(target, prompts, 16)
    runs = [
        speculative_generate(
            target, drafter, make_policy("echo", replace(cfg, control_kernel=k), fused=TRITON), prompts, 16
        )
        for k in ("torch", "triton")
    ]
    for res in runs:
        assert res.tokens == ar.tokens
    assert runs[0].steps == runs[1].steps and runs[0].verified == runs[1].verified and runs[0].mat > 1.0
