"""What machine ran a measurement: recorded in every result file beside the figures.

Ratios are only comparable on one machine, and on CPUs the instruction set decides which dtype
and kernels are fast (AVX2 hosts run bf16 GEMMs through conversions; AVX-512 BF16 / AMX natively),
so the ISA and oneDNN's bf16 support are recorded with the usual platform and torch facts.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

from sglang_echo.platform.cpu import cpu_has_bf16_gemm


def _cpuinfo() -> tuple[str, list[str]]:
    """(model name, vector ISA flags) from /proc/cpuinfo; (processor(), []) where there is none."""
    name, flags = platform.processor(), []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not name:
                name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = sorted(f for f in value.split() if f.startswith(("avx", "amx")))
    except OSError:
        pass
    return name, flags


def describe() -> dict:
    cpu, isa = _cpuinfo()
    return {
        "node": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "isa": isa,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn_bf16": cpu_has_bf16_gemm(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_average": list(os.getloadavg()),
    }
