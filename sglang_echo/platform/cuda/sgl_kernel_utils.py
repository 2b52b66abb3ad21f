"""`sgl_kernel.utils` on CUDA: `is_arch_support_pdl`, which sglang's Triton attention backend asks
(`sglang/srt/layers/attention/triton_backend.py`) before launching its kernels with programmatic
dependent launch. As sgl_kernel's: True on SM90 and newer (the current device)."""

from __future__ import annotations

from functools import lru_cache

import torch


@lru_cache(maxsize=None)
def _pdl_on(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def is_arch_support_pdl() -> bool:
    if torch.version.cuda is None or not torch.cuda.is_available():
        return False
    return _pdl_on(torch.cuda.current_device())


__sglang_echo_shim__ = "cuda"
