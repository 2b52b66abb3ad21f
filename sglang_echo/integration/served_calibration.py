"""The calibration a server gates with: the file ``SGLANG_ECHO_CALIBRATION`` names, checked against
what the server runs.

A calibration's thresholds are the drafter's confidences on one target (ECHO Sec. 3.3), so a file
made for another model, head or drafter kind is refused, never silently used
(:mod:`sglang_echo.core.calibration_file`). What "the server runs" means is the pair whose
confidences the gates see: the served model and head, or, under simulated acceptance
(``SGLANG_ECHO_SIMULATE``, :mod:`.simulate`), the pair the trace was recorded with.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from sglang_echo import env

from . import simulate
from .config import ELASTIC, Drafter, EchoConfig

log = logging.getLogger(__name__)


def drafter_fingerprint(drafter: str, draft_path: Optional[str | Path] = None) -> Optional[str]:
    """What a calibration file records as the drafter's identity: the head directory's
    fingerprint for a trained drafter, the parameter set for the parameter-free n-gram one."""
    from sglang_echo.core.calibration_file import fingerprint, local_dir

    if drafter == "ngram":
        from sglang_echo.drafters.ngram import NGramDrafter

        return "ngram:" + NGramDrafter().describe()
    local = local_dir(draft_path) if draft_path else None
    return fingerprint(local) if local else None


def gated_identity(
    cfg: EchoConfig, model_path: Optional[str], draft_path: Optional[str]
) -> tuple[Optional[str], Optional[str]]:
    """The model and drafter fingerprints ``cfg.calibration`` must have been made for: the trace's
    recorded pair under a simulation (the gates see its confidences), else the served model and
    head, which must be local to be fingerprinted."""
    from sglang_echo.core.calibration_file import CalibrationError, fingerprint, local_dir

    stem = env.get(simulate.ENV)
    if stem is not None:
        try:
            recorded = simulate.trace_identity(stem)
        except simulate.SimulationError as e:
            raise CalibrationError(f"{cfg.calibration}: {e}") from None
        return recorded["model"], recorded["drafter"]
    for what, path in (("model", model_path), ("draft head", None if cfg.drafter == Drafter.NGRAM else draft_path)):
        if path and local_dir(path) is None:
            raise CalibrationError(
                f"{cfg.calibration}: cannot check it against the {what} {path!r}, which is neither a local "
                f"folder nor in the Hugging Face cache: download it first (huggingface-cli download {path}) "
                "or pass a local path"
            )
    model_fp = fingerprint(local_dir(model_path)) if model_path else None
    return model_fp, drafter_fingerprint(cfg.drafter, draft_path)


def load_calibration_for(cfg: EchoConfig, *, model_path: Optional[str] = None, draft_path: Optional[str] = None):
    """The calibration named by ``cfg.calibration`` (checked against the drafter kind and the
    model and draft fingerprints, :func:`gated_identity`), or None (then the documented default
    gates are used, and this is logged).

    Raises :class:`~sglang_echo.core.calibration_file.CalibrationError` for a missing, malformed
    or mismatched file.
    """
    from sglang_echo.core.calibration_file import load_calibration
    from sglang_echo.core.gating import GatingConfig

    if cfg.calibration is None:
        if cfg.policy in ELASTIC:
            d = GatingConfig.default()
            log.warning(
                "ECHO: no calibration file (SGLANG_ECHO_CALIBRATION), gating with %s: %s", d.source, d.describe()
            )
        return None
    model_fp, draft_fp = gated_identity(cfg, model_path, draft_path)
    calib = load_calibration(
        cfg.calibration, model_fingerprint=model_fp, drafter_kind=cfg.drafter, drafter_fingerprint=draft_fp
    )
    log.warning(
        "ECHO: calibration %s: sweet spots %s, thresholds %s",
        cfg.calibration,
        list(calib.sweet_spots),
        [round(calib.threshold(d), 3) for d in calib.sweet_spots],
    )
    return calib
