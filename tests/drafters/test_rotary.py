"""The heads' RoPE (``drafters/rotary.py``): read from config.json as transformers reads it, and
applied with transformers' frequencies, bit-for-bit the old formula on the shipped heads' plain RoPE."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from sglang_echo.drafters.dart_head import DartConfig
from sglang_echo.drafters.dflash_head import DFlashConfig
from sglang_echo.drafters.eagle3_head import Eagle3Config
from sglang_echo.drafters.rotary import read_rope, rope
from sglang_echo.models.drafts import SHIPPED

ROOT = Path(__file__).resolve().parents[2]
LLAMA31_HEAD = json.loads((ROOT / "benchmarks/configs/eagle3-llama-3.1-8b.json").read_text())
LLAMA31_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
CONFIGS = {"eagle3": Eagle3Config, "dart": DartConfig, "dflash": DFlashConfig}


def old_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """The heads' RoPE before scaling was read (plain theta only): the reference for plain RoPE."""
    D = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D)
    ang = positions.float()[..., None] * inv
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., : D // 2].float(), x[..., D // 2 :].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)


def hf_rope(x: torch.Tensor, positions: torch.Tensor, config: dict) -> torch.Tensor:
    """transformers' own Llama RoPE for ``config`` (a full model config), in fp32; x [B, h, T, D]."""
    emb = LlamaRotaryEmbedding(LlamaConfig(**copy.deepcopy(config)))
    cos, sin = emb(x.float(), positions)
    out, _ = apply_rotary_pos_emb(x.float(), x.float(), cos, sin)
    return out


def sample(head_dim: int, positions: list[int], dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, len(positions), head_dim, generator=g).to(dtype)
    pos = torch.tensor([positions, [p + 5 for p in positions]])
    return x, pos


@pytest.mark.parametrize("kind", list(SHIPPED))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_shipped_heads_plain_rope_is_bit_for_bit_the_old_formula(kind, dtype):
    raw = json.loads((SHIPPED[kind] / "config.json").read_text())
    cfg = CONFIGS[kind].from_hf(raw)
    assert cfg.rope_scaling is None and cfg.rope_theta == raw["rope_theta"] == 100000.0
    x, pos = sample(cfg.head_dim, [0, 1, 7, 100, 2047, 8191], dtype)
    got = rope(x, pos[:, None, :], cfg)
    assert got.dtype == dtype and torch.equal(got, old_rope(x, pos[:, None, :], cfg.rope_theta))


def test_llama31_head_runs_llama3_scaling_as_transformers_does():
    raw = {**LLAMA31_HEAD, "rope_scaling": LLAMA31_SCALING}
    cfg = Eagle3Config.from_hf(raw)
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling["rope_type"] == "llama3"
    positions = [0, 3, 1000, 8191, 20000, 131071]
    x, pos = sample(cfg.head_dim, positions)
    got = rope(x, pos[:, None, :], cfg)
    want = hf_rope(x, pos, {k: v for k, v in raw.items() if k not in ("architectures", "eagle_config")})
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    # The scaling matters: the plain RoPE the heads ran before drifts far from it at long positions.
    assert (old_rope(x, pos[:, None, :], 500000.0) - want).abs().max() > 0.1


def test_transformers5_rope_parameters_give_the_same_head():
    """transformers 5 writes rope_parameters (no top-level rope_theta): the theta was read as 10000."""
    legacy = Eagle3Config.from_hf({**LLAMA31_HEAD, "rope_scaling": LLAMA31_SCALING})
    v5 = {k: v for k, v in LLAMA31_HEAD.items() if k != "rope_theta"}
    v5["rope_parameters"] = {"rope_theta": 500000.0, **LLAMA31_SCALING}
    assert Eagle3Config.from_hf(v5) == legacy
    plain = {k: v for k, v in LLAMA31_HEAD.items() if k != "rope_theta"}
    plain["rope_parameters"] = {"rope_theta": 500000.0, "rope_type": "default"}
    assert Eagle3Config.from_hf(plain).rope_theta == 500000.0
    assert Eagle3Config.from_hf(plain).rope_scaling is None


@pytest.mark.parametrize(
    "scaling",
    [
        {"rope_type": "linear", "factor": 4.0},
        {"type": "dynamic", "factor": 2.0},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512},
    ],
)
def test_linear_dynamic_and_yarn_follow_transformers(scaling):
    base = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "head_dim": 16,
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "rope_scaling": scaling,
    }
    theta, read = read_rope(base, 16, 2048)
    cfg = DFlashConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=16,
        intermediate_size=8,
        vocab_size=32,
        num_hidden_layers=1,
        target_layer_ids=(1,),
        num_target_layers=4,
        rope_theta=theta,
        rope_scaling=read,
        max_position_embeddings=2048,
    )
    for positions in ([0, 5, 100, 2000], [3, 4000, 6000, 9000]):  # dynamic rescales past 2048 positions
        x, pos = sample(16, positions, seed=len(positions))
        want = hf_rope(x, pos, base)  # dynamic: the batch's largest position, as transformers takes it
        torch.testing.assert_close(rope(x, pos[:, None, :], cfg), want, rtol=1e-6, atol=1e-5)


def test_scaled_heads_write_what_they_read():
    e = Eagle3Config.from_hf({**LLAMA31_HEAD, "rope_scaling": LLAMA31_SCALING})
    written = e.to_hf()
    assert written["rope_scaling"] == LLAMA31_SCALING and Eagle3Config.from_hf(written) == e
    d = DartConfig.from_hf({**e.to_hf(), "architectures": ["LlamaForCausalLMDart"], "draft_length": 3})
    assert d.rope_scaling == LLAMA31_SCALING and DartConfig.from_hf(d.to_hf()) == d
    assert "rope_scaling" not in Eagle3Config.from_hf(LLAMA31_HEAD).to_hf()  # plain: SpecForge's keys only
    f = DFlashConfig.for_target(
        {**LLAMA31_HEAD, "num_hidden_layers": 32, "rope_parameters": {"rope_theta": 500000.0, **LLAMA31_SCALING}}
    )
    assert f.rope_scaling == LLAMA31_SCALING
    assert f.to_hf()["rope_parameters"] == {"rope_theta": 500000.0, **LLAMA31_SCALING}
    assert DFlashConfig.from_hf(f.to_hf()) == f


def test_a_target_with_scaled_rope_gives_a_scaled_head():
    target = json.loads((ROOT / "benchmarks/configs/llama-3.1-8b.json").read_text())
    target["rope_scaling"] = LLAMA31_SCALING
    assert Eagle3Config.for_target(target, draft_vocab_size=32000).rope_scaling == LLAMA31_SCALING


@pytest.mark.parametrize(
    "rope, match",
    [
        (
            {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
            "rope settings .* transformers rejects them .*low_freq_factor",
        ),
        (
            {"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [1.0] * 8}},
            "rope_type 'longrope': the draft heads run default, linear, dynamic, llama3, yarn",
        ),
        ({"rope_theta": "fast"}, "rope_theta 'fast': not a number"),
        (
            {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4}}},
            "rope_parameters per layer type \\(full_attention\\): the draft heads run one RoPE",
        ),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5"),
    ],
)
def test_bad_rope_settings_are_one_line_errors(rope, match):
    with pytest.raises(ValueError, match=match) as e:
        Eagle3Config.from_hf({**LLAMA31_HEAD, **rope})
    assert "\n" not in str(e.value)
