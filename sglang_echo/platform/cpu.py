"""What the host CPU can do that changes how it should serve (imports torch only when asked)."""

from __future__ import annotations


def cpu_has_bf16_gemm() -> bool:
    """True where oneDNN runs bf16 dot products natively (AVX-512 BF16, AMX, AVX-NE-CONVERT)."""
    import torch

    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
