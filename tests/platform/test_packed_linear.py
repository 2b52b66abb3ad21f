"""Packed linears and LM heads (CPU platform): same results as sglang's, batch invariant, never stale."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang_echo.platform import packed_linear as pl

pytestmark = pytest.mark.skipif(not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"), reason="no oneDNN")


def _linear_layer(out_f: int = 96, in_f: int = 64, dtype=torch.float32, bias: bool = True):
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    g = torch.Generator().manual_seed(0)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(out_f, in_f, generator=g).to(dtype), requires_grad=False)
    layer.bias = torch.nn.Parameter(torch.randn(out_f, generator=g).to(dtype), requires_grad=False) if bias else None
    layer.quant_method = UnquantizedLinearMethod()
    return layer


def _load(layer):
    """What the model loader does after loading, with the platform's hook around it."""
    pl.after_weights_loaded(type(layer.quant_method).process_weights_after_loading, layer.quant_method, layer)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_equals_f_linear_and_is_batch_invariant(dtype):
    layer = _linear_layer(dtype=dtype)
    _load(layer)
    assert type(layer.quant_method).__name__ == "PackedLinearMethod"
    x = torch.randn(3, 7, 64).to(dtype)
    got = layer.quant_method.apply(layer, x, layer.bias)
    want = F.linear(x.float(), layer.weight.float(), layer.bias.float())
    assert got.shape == (3, 7, 96) and got.dtype == dtype
    torch.testing.assert_close(
        got.float(),
        want,
        rtol=1e-2 if dtype == torch.bfloat16 else 1e-5,
        atol=1e-2 if dtype == torch.bfloat16 else 1e-4,
    )
    rows = x.reshape(-1, 64)
    full = layer.quant_method.apply(layer, rows, layer.bias)
    for m in (1, 2, 3, 5, 8):  # a row's output does not depend on how many rows share the call
        assert torch.equal(layer.quant_method.apply(layer, rows[:m], layer.bias), full[:m])


def test_an_in_place_weight_update_repacks():
    layer = _linear_layer(bias=False)
    _load(layer)
    x = torch.randn(4, 64)
    before = layer.quant_method.apply(layer, x)
    with torch.no_grad():
        layer.weight.mul_(2)  # e.g. a weight update from disk, copied into the parameter
    after = layer.quant_method.apply(layer, x)
    torch.testing.assert_close(after, 2 * before, rtol=1e-5, atol=1e-4)


def test_off_switch_and_unpackable_layers_keep_sglangs_method(monkeypatch):
    monkeypatch.setenv(pl.ENV, "0")
    layer = _linear_layer()
    _load(layer)
    assert type(layer.quant_method).__name__ == "UnquantizedLinearMethod"
    monkeypatch.delenv(pl.ENV)
    half = _linear_layer(dtype=torch.float16)  # oneDNN packing here: fp32 and bf16 only
    _load(half)
    assert type(half.quant_method).__name__ == "UnquantizedLinearMethod"


class _Processor:
    use_fp32_lm_head = False
    rl_on_policy_target = None


def test_lm_head_plain_branch_is_packed_and_the_rest_falls_through():
    from sglang.srt.layers.quantization.unquant import UnquantizedEmbeddingMethod

    head = torch.nn.Module()
    head.weight = torch.nn.Parameter(torch.randn(500, 64), requires_grad=False)
    head.quant_method = UnquantizedEmbeddingMethod()
    hidden = torch.randn(5, 64)
    calls = []

    def original(proc, h, lm_head, bias=None, **kw):
        calls.append(kw)
        return torch.matmul(h, lm_head.weight.T)

    got = pl.compute_lm_head(original, _Processor(), hidden, head, None, out=None)
    torch.testing.assert_close(got, hidden @ head.weight.T, rtol=1e-5, atol=1e-4)
    assert not calls and "echo_packed_weight" in head.__dict__
    fp32_head = _Processor()
    fp32_head.use_fp32_lm_head = True  # sglang's own branches stay sglang's
    pl.compute_lm_head(original, fp32_head, hidden, head, None, out=None)
    pl.compute_lm_head(original, _Processor(), hidden, head, torch.zeros(500), out=None)
    assert len(calls) == 2
