"""The batch's verification cap ``K_max`` (ECHO Eq. 2 and 4), and where each server's comes from.

Eq. 2 models a verify pass as flat in the verified tokens up to ``K_max``, "the computing limit
of the hardware", and linear beyond; Eq. 4 caps every step's super-tree at ``sum_i K_i <=
K_max``, roots included. The knee is a property of the device and the target, so a cap measured
on one device says nothing about another: a calibration records the device its verify curve was
measured on (:class:`Device`) and :func:`resolve_kmax` uses its ``k_max`` only on that device.

A fixed cap stops speculation once the batch reaches it (the roots alone fill it). Where
verification stays memory-bound well past one token per request, as on a GPU (an 8B-shaped
target on an H100 verifies 2 tokens per request at batch 256 in 1.24x the time of 1), the cap
should grow with the batch so that ECHO keeps drafting at 64-256 concurrent requests. So a cap is
``K_max(B) = max(flat, ceil(B (1 + per_request)))``: the knee, or room for ``per_request``
drafted tokens per request, whichever is more; Algorithm 1 then spends those on the confident
requests first.
"""

from __future__ import annotations

import math
import platform
from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class Device:
    """What a verify-cost measurement was taken on: ``kind`` (``cpu`` or ``cuda``) and the model name."""

    kind: str
    name: str

    @classmethod
    def of(cls, device: str | torch.device) -> "Device":
        dev = torch.device(device)
        if dev.type == "cuda":
            return cls("cuda", torch.cuda.get_device_name(dev))
        return cls(dev.type, _cpu_name() if dev.type == "cpu" else dev.type)

    @classmethod
    def from_json(cls, raw: Optional[dict]) -> Optional["Device"]:
        if not raw:
            return None
        return cls(str(raw["kind"]), str(raw["name"]))

    def describe(self) -> str:
        return f"{self.kind}: {self.name}"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass(frozen=True)
class KMax:
    """``K_max(B) = max(flat, ceil(B (1 + per_request)))`` if it grows with the batch, else ``flat``;
    roots included; ``source`` says where it came from."""

    flat: int
    per_request: float = 0.0
    source: str = "fixed"

    def __post_init__(self) -> None:
        if self.flat < 1 or self.per_request < 0:
            raise ValueError(f"K_max needs flat >= 1 and per_request >= 0, got {self}")

    def __call__(self, batch_size: int) -> int:
        if not self.per_request:  # the paper's fixed cap (a batch over it verifies its roots alone)
            return self.flat
        return max(self.flat, math.ceil(batch_size * (1 + self.per_request)))

    def describe(self) -> str:
        grow = f", at least {self.per_request:g} draft(s) per request" if self.per_request else ""
        return f"K_max {self.flat}{grow} ({self.source})"


# Without a measured knee: the paper's fixed 64 on a CPU (whose verify pass is compute-bound from
# the first token: ``budget: cost`` picks each step's cap below it); on a GPU the 8B-shaped
# H100 verify curve's flat part (up to about 256 tokens), growing with the batch to one draft per
# request.
CPU_DEFAULT = KMax(64, 0.0, "default for CPUs")
GPU_DEFAULT = KMax(256, 1.0, "default for GPUs")


def resolve_kmax(
    configured: Optional[int], device: Device, measured: Optional[int] = None, measured_on: Optional[Device] = None
) -> tuple[KMax, Optional[str]]:
    """The server's cap and, when a measured one was set aside, why (for the log).

    A ``configured`` cap (an explicit setting) is used as is, fixed (the paper's Eq. 4). Else a
    calibration's ``measured`` knee where it was measured on this very ``device`` (growing with
    the batch on a GPU as the default does); else the device's default.
    """
    if configured is not None:
        return KMax(configured, 0.0, "configured"), None
    default = GPU_DEFAULT if device.kind == "cuda" else CPU_DEFAULT
    if measured is None:
        return default, None
    if measured_on != device:
        where = measured_on.describe() if measured_on else "an unrecorded device"
        return default, (
            f"the calibration's K_max {measured} was measured on {where}, not on this "
            f"{device.describe()}: using the {default.source}"
        )
    return KMax(measured, default.per_request, f"measured on this {device.kind} by the calibration"), None
