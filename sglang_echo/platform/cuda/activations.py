"""`sgl_kernel.{silu,gelu,gelu_tanh}_and_mul` on CUDA, in torch.

`sglang/srt/layers/activation.py` runs its own JIT act-and-mul kernel on CUDA and calls these
only where the output width is not a multiple of the JIT kernel's vector (8 bf16/fp16 elements
before SM100, 16 from it), as in small or tensor-split MLPs; gguf.py and the Triton MoE runner
import them too. Semantics are sgl_kernel's (FlashInfer's ``act_and_mul``): with
``d = input.shape[-1] // 2``, ``out = act(input[..., :d]) * input[..., d:]`` computed in fp32 and
cast once; ``out`` (allocated when None) is filled in place and returned.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F


def _act_and_mul(
    act: Callable[[torch.Tensor], torch.Tensor], input: torch.Tensor, out: Optional[torch.Tensor]
) -> torch.Tensor:
    d = input.shape[-1] // 2
    if out is None:
        out = input.new_empty(*input.shape[:-1], d)
    out.copy_(act(input[..., :d].float()) * input[..., d:].float())
    return out


def silu_and_mul(
    input: torch.Tensor, out: Optional[torch.Tensor] = None, enable_pdl: Optional[bool] = None
) -> torch.Tensor:
    return _act_and_mul(F.silu, input, out)


def gelu_and_mul(
    input: torch.Tensor, out: Optional[torch.Tensor] = None, enable_pdl: Optional[bool] = None
) -> torch.Tensor:
    return _act_and_mul(F.gelu, input, out)


def gelu_tanh_and_mul(
    input: torch.Tensor, out: Optional[torch.Tensor] = None, enable_pdl: Optional[bool] = None
) -> torch.Tensor:
    return _act_and_mul(lambda a: F.gelu(a, approximate="tanh"), input, out)
