"""Calibrations that ship with the package (``sglang_echo/assets/calibration/``).

``make serve`` runs ECHO on SmolLM2 with the shipped EAGLE-3 head; the calibration made for
exactly that pair (``echo-calibrate`` output, fingerprints included) ships too, so the default
server gates with measured thresholds instead of the paper's. A file is used only when its
fingerprints match the model and drafter being served; anything else falls back to the
documented defaults, which the plugin logs.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Optional

from sglang_echo.core.calibration_file import CalibrationError, fingerprint, load_calibration

SHIPPED = Path(str(importlib.resources.files("sglang_echo") / "assets" / "calibration"))


def shipped_calibration(
    model: Path, drafter: str, draft: Optional[Path] = None, root: Path = SHIPPED
) -> Optional[Path]:
    """The shipped calibration made for this model and drafter, or None."""
    from sglang_echo.integration.served_calibration import drafter_fingerprint

    model_fp, draft_fp = fingerprint(model), drafter_fingerprint(drafter, draft)
    for path in sorted(root.glob("*.json")):
        try:
            load_calibration(path, model_fingerprint=model_fp, drafter_kind=drafter, drafter_fingerprint=draft_fp)
        except CalibrationError:
            continue
        return path
    return None
