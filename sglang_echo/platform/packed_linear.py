"""Linear layers and LM heads on oneDNN-prepacked weights (CPU platform).

Why: on CPUs without sglang's AMX kernels every linear is ``F.linear`` (MKL), which repacks the
weight on every call. At the few-row shapes of decoding and tree verification that repacking is
most of the cost: on the 2-core AVX-512 host an fp32 [1536 x 576] projection takes 104 / 153 /
184 us for 1 / 2 / 4 rows, the prepacked oneDNN kernel 55 / 52 / 61 us, and SmolLM2's 49k-row
LM head 10 ms / 22 ms for 1 / 2 rows. It also makes the result nearly *batch invariant*: oneDNN
picks its kernel by the number of rows, and within a kernel a row's output does not depend on the
other rows (MKL's does, by ~1e-5 in fp32). The platform's batch-invariant mode (``deterministic.py``)
therefore runs every call at row counts that share one kernel (:func:`set_batch_invariant`), so
that a verify pass over ``K`` tree tokens computes bit for bit what decoding them one at a time
would.

How (no sglang file is edited):
* an AROUND hook on ``UnquantizedLinearMethod.process_weights_after_loading`` packs each CPU
  float weight once (``torch.ops.mkldnn._reorder_linear_weight``) and swaps the layer's
  ``quant_method`` for :class:`PackedLinearMethod`, whose ``apply`` runs
  ``torch.ops.mkldnn._linear_pointwise``;
* an AROUND hook on ``LogitsProcessor._compute_lm_head`` does the same for the plain LM-head
  branch, packing lazily per head (it is often the tied embedding table, which stays as is).

The original weights are kept (``apply_into``, weight reloads, tied embeddings read them), so
packed layers hold a second copy of their weights: fine for the small models a CPU serves, and
``SGLANG_ECHO_PACKED_LINEAR=0`` turns the whole thing off. A packed copy is tied to its source
tensor's storage and version counter, so an in-place weight update re-packs instead of serving
stale weights.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import torch
from torch import Tensor

ENV = "SGLANG_ECHO_PACKED_LINEAR"
_DTYPES = (torch.float32, torch.bfloat16)
_UNSUPPORTED: set[torch.dtype] = set()  # dtypes this CPU's oneDNN cannot pack
# LM-head methods sglang computes as a plain matmul (its ``_UNQUANTIZED_LM_HEAD_METHODS``, plus ours)
_PLAIN_LM_HEAD_METHODS = {"UnquantizedEmbeddingMethod", "UnquantizedLinearMethod", "PackedLinearMethod", "NoneType"}


def enabled() -> bool:
    return os.environ.get(ENV, "1").lower() not in ("0", "false", "no", "off")


def _packable(weight: Any) -> bool:
    return (
        isinstance(weight, Tensor)
        and weight.device.type == "cpu"
        and weight.dim() == 2
        and weight.dtype in _DTYPES
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


class PackedWeight:
    """A oneDNN-prepacked copy of a ``[out, in]`` weight, valid while the source is unchanged."""

    __slots__ = ("packed", "_key")

    def __init__(self, weight: Tensor) -> None:
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
        self._key = self.key(weight)

    @staticmethod
    def key(weight: Tensor) -> tuple[int, int]:
        return weight.data_ptr(), weight._version

    def fresh(self, weight: Tensor) -> bool:
        return self._key == self.key(weight)


INVARIANT_ROWS = (2, 32)
"""Rows per oneDNN call in the batch-invariant mode (:func:`set_batch_invariant`), fewest and most."""
_INVARIANT = False


def set_batch_invariant(on: bool) -> None:
    """Run every call as oneDNN calls of 2 to 32 rows (:data:`INVARIANT_ROWS`): a single row is
    padded with a zero row, a longer input is cut into 32-row calls. oneDNN picks its kernel by the
    number of rows, and a row's bits follow the kernel. Measured per host kind (and checked by
    ``tests/platform/test_invariant_attention.py`` wherever it runs):

    * AVX2 / AVX-512 without AMX: one row alone takes another kernel than 2 or more for some shapes
      (SmolLM2's ``down_proj``, K = 1536: another summation order, visible in 1-2 of 64 bf16 rows
      and in every fp32 row); 2 to 2048 rows give each row the same bits;
    * AMX: bf16 calls of 1 to 32 rows agree; from 33 rows on oneDNN runs other kernels, whose
      sums differ in the last bits on some rows (SmolLM2's layers: 3-25 of 33-128 rows against
      the same rows in a 2048-row call). fp32 as without AMX.

    So 2 to 32 rows hold on both. A forward of up to 32 tokens runs each linear as one call, as
    without the mode; more tokens (a larger batch, a prefill) as several 32-row calls."""
    global _INVARIANT
    _INVARIANT = on


def batch_invariant() -> bool:
    return _INVARIANT


def unsupported_dtypes() -> list[str]:
    """The dtypes this CPU's oneDNN refused to pack so far (those layers run ``F.linear``)."""
    return sorted(str(d) for d in _UNSUPPORTED)


def packed_linear(x: Tensor, packed: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``F.linear(x, weight, bias)`` on a packed weight, for any leading shape of ``x``."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    y = _invariant_linear(x2, packed, bias) if _INVARIANT else _linear(x2, packed, bias)
    return y.view(*lead, y.shape[-1])


def _linear(x2: Tensor, packed: Tensor, bias: Optional[Tensor]) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x2, packed, bias, "none", [], "")


def _invariant_linear(x2: Tensor, packed: Tensor, bias: Optional[Tensor]) -> Tensor:
    """``_linear`` in calls of :data:`INVARIANT_ROWS` rows (:func:`set_batch_invariant`)."""
    fewest, most = INVARIANT_ROWS
    rows = x2.shape[0]
    if rows > most:  # the last call may be a single row: padded below
        return torch.cat([_invariant_linear(part, packed, bias) for part in x2.split(most)])
    if rows < fewest:
        return _linear(torch.cat([x2, x2.new_zeros(fewest - rows, x2.shape[1])]), packed, bias)[:rows]
    return _linear(x2, packed, bias)


def _packed_for(module: Any, weight: Tensor) -> Optional[Tensor]:
    """The module's packed copy of ``weight`` (made or re-made when missing or stale)."""
    pw = module.__dict__.get("echo_packed_weight")
    if pw is None or not pw.fresh(weight):
        if not _packable(weight) or weight.dtype in _UNSUPPORTED:
            return None
        try:
            pw = PackedWeight(weight)
        except RuntimeError:  # oneDNN lacks this dtype's path on this CPU (bf16 needs AVX-512 or AVX-NE-CONVERT)
            _UNSUPPORTED.add(weight.dtype)  # F.linear from now on, without retrying every call
            return None
        module.__dict__["echo_packed_weight"] = pw
    return pw.packed


def _make_linear_method() -> type:
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    class PackedLinearMethod(UnquantizedLinearMethod):
        """sglang's unquantized linear, computed on the layer's packed weight on the CPU."""

        def apply(self, layer, x: Tensor, bias: Optional[Tensor] = None) -> Tensor:
            w = layer.weight
            if x.device.type == "cpu" and x.dtype == w.dtype:
                packed = _packed_for(layer, w)
                if packed is not None:
                    return packed_linear(x, packed, bias)
            return super().apply(layer, x, bias)

    return PackedLinearMethod


_METHOD: Optional[Any] = None


def after_weights_loaded(original: Callable[..., Any], method: Any, layer: Any) -> Any:
    """AROUND ``UnquantizedLinearMethod.process_weights_after_loading``: pack, switch methods."""
    global _METHOD
    result = original(method, layer)
    w = getattr(layer, "weight", None)
    if enabled() and type(method).__name__ == "UnquantizedLinearMethod" and _packable(w):
        if _METHOD is None:
            _METHOD = _make_linear_method()()
        _packed_for(layer, w)
        layer.quant_method = _METHOD
    return result


def compute_lm_head(
    original: Callable[..., Any],
    processor: Any,
    hidden_states: Tensor,
    lm_head: Any,
    embedding_bias: Optional[Tensor] = None,
    **kwargs: Any,
) -> Tensor:
    """AROUND ``LogitsProcessor._compute_lm_head``: its plain-matmul branch on a packed head."""
    w = getattr(lm_head, "weight", None)
    plain = (
        enabled()
        and embedding_bias is None
        and hidden_states.device.type == "cpu"
        and not (hasattr(lm_head, "set_lora") and hasattr(lm_head, "apply_lora"))
        and not getattr(processor, "use_fp32_lm_head", False)
        and getattr(processor, "rl_on_policy_target", None) is None
        and not getattr(lm_head, "use_intel_amx_backend", False)
        and type(getattr(lm_head, "quant_method", None)).__name__ in _PLAIN_LM_HEAD_METHODS
    )
    if plain and isinstance(w, Tensor):
        packed = _packed_for(lm_head, w)
        if packed is not None:
            return packed_linear(hidden_states.to(w.dtype), packed)
    return original(processor, hidden_states, lm_head, embedding_bias, **kwargs)


def pack_linears(model: torch.nn.Module) -> int:
    """Run every packable ``nn.Linear`` of a (HF) model on packed weights; returns how many.

    For the repo's own offline uses of the target (self-distillation, feature capture, the offline
    speculative loop, cost curves), so they compute what the CPU server computes, as fast. Layers
    fall back to ``F.linear`` whenever autograd needs the weight."""
    n = 0
    for m in model.modules():
        if type(m) is torch.nn.Linear and enabled() and _packable(m.weight):
            m.forward = _PackedForward(m)
            n += 1
    return n


class _PackedForward:
    """``nn.Linear.forward`` on the module's packed weight (an instance attribute, so
    ``type(m).forward`` and checkpoints are untouched)."""

    def __init__(self, module: torch.nn.Linear) -> None:
        self.module = module

    def __call__(self, x: Tensor) -> Tensor:
        m = self.module
        if (
            x.device.type == "cpu"
            and x.dtype == m.weight.dtype
            and not (torch.is_grad_enabled() and m.weight.requires_grad)
        ):
            packed = _packed_for(m, m.weight)
            if packed is not None:
                return packed_linear(x, packed, m.bias)
        return torch.nn.functional.linear(x, m.weight, m.bias)


def register(hooks: Any, around: Any) -> None:
    """Install both hooks (``hooks`` is sglang's HookRegistry, ``around`` its AROUND type)."""
    hooks.register(
        "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.process_weights_after_loading",
        after_weights_loaded,
        around,
    )
    hooks.register("sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head", compute_lm_head, around)
