"""Launch-side sizes shared by the control kernels."""

from __future__ import annotations

import triton


def block(n: int) -> int:
    """A power-of-two tile covering ``n`` (Triton's ``arange`` needs one), at least 2."""
    return max(triton.next_power_of_2(n), 2)
