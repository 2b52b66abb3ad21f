"""The GPU cost-curve tool, checked where no GPU is needed: shapes read from HF configs, the verify
batch it times is the computation sglang's TARGET_VERIFY runs (causal chains over a KV prefix),
and the curves it wrote on an H100 load as replay cost models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sglang_echo.kernels import verify_cost
from sglang_echo.kernels.tree_attention import tree_attention_reference
from sglang_echo.replay.cost import CostModel

ROOT = Path(__file__).resolve().parents[2]


def test_llama_shape_from_hf_configs():
    s = verify_cost.LlamaShape.from_hf(json.loads((ROOT / "benchmarks/configs/llama-3.1-8b.json").read_text()))
    assert (s.hidden, s.heads, s.kv_heads, s.head_dim, s.inter, s.vocab, s.layers) == (
        4096,
        32,
        8,
        128,
        14336,
        128256,
        32,
    )
    assert s.rope_theta == 500000.0
    small = verify_cost.LlamaShape.from_hf(
        json.loads((ROOT / "benchmarks/configs/smollm2-135m-instruct.json").read_text())
    )
    assert (small.hidden, small.heads, small.kv_heads, small.head_dim, small.layers) == (576, 9, 3, 64, 30)


@pytest.mark.parametrize("chain", [True, False])
def test_ragged_batch_is_a_causal_chain_over_the_prefix(chain):
    B, W, P, H, D = 3, 5, 7, 2, 8
    rb = verify_cost.RaggedBatch.build(B, W, P, chain, "cpu")
    g = torch.Generator().manual_seed(0)
    k = torch.randn(B * (P + W), H, D, generator=g)
    v = torch.randn(B * (P + W), H, D, generator=g)
    q = torch.randn(B * W, H, D, generator=g)
    got = tree_attention_reference(
        q, k, v, rb.qo_indptr, rb.kv_indptr, rb.kv_indices, rb.tree_slots, rb.packed_mask, D**-0.5
    )
    for b in range(B):
        keys = slice(b * (P + W), (b + 1) * (P + W))  # request b's slots: prefix, then its own rows
        visible = torch.ones(W, P + W, dtype=torch.bool)
        visible[:, P:] = torch.tril(torch.ones(W, W, dtype=torch.bool)) if chain else torch.eye(W, dtype=torch.bool)
        want = torch.nn.functional.scaled_dot_product_attention(
            q[b * W : (b + 1) * W].transpose(0, 1), k[keys].transpose(0, 1), v[keys].transpose(0, 1), attn_mask=visible
        )
        torch.testing.assert_close(got[b * W : (b + 1) * W], want.transpose(0, 1), atol=1e-5, rtol=1e-5)
    want_pos = torch.arange(P, P + W) if chain else torch.full((W,), P + 1)
    assert torch.equal(rb.positions, want_pos.repeat(B))


def test_h100_curves_load_as_replay_cost_models():
    for name in ("cost-llama-3.1-8b.json", "cost-smollm2.json", "cost-llama-3.1-8b-prefix2048.json"):
        m = CostModel.load(ROOT / "benchmarks/results/gpu-h100" / name)
        assert m.meta["machine"]["gpu"].startswith("NVIDIA H100")
        assert m.verify(64, 64) <= m.verify(64, 1024)  # more verified tokens never cost less
    assert CostModel.load(ROOT / "benchmarks/results/gpu-h100/cost-llama-3.1-8b.json").draft_priced("eagle3")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_no_cuda_message_and_exit_zero(tmp_path, capsys):
    argv = [
        "--target-config",
        str(ROOT / "benchmarks/configs/smollm2-135m-instruct.json"),
        "--out",
        str(tmp_path / "x.json"),
    ]
    assert verify_cost.main(argv) == 0
    assert "CUDA is not available" in capsys.readouterr().out
    assert not (tmp_path / "x.json").exists()
