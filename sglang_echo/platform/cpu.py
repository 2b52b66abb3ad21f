"""What the host CPU can do that changes how it should serve (imports torch only when asked)."""

from __future__ import annotations


def cpu_has_bf16_gemm() -> bool:
    """True where oneDNN runs bf16 dot products natively (AVX-512 BF16, AMX, AVX-NE-CONVERT)."""
    import torch

    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def cpu_has_amx_bf16() -> bool:
    """True where the CPU has AMX tiles for bf16 (Sapphire Rapids and later): there bf16 GEMMs run on
    the matrix unit; with AVX-512 BF16 alone they run on the vector units."""
    import torch

    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    if probe is not None and not probe():
        return False
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " amx_bf16" in line for line in f)
    except OSError:
        return bool(probe and probe())
