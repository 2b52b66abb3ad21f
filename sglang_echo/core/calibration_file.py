"""The calibration file: what the warm-up calibrator writes and the ECHO plugin loads.

Schema ``sglang-echo/calibration`` version 1 (JSON)::

    {
      "schema": "sglang-echo/calibration",
      "version": 1,
      "created": "2026-11-22T10:00:00Z",
      "model":   {"name": "SmolLM2-135M-Instruct", "fingerprint": "sha256:..."},
      "drafter": {"kind": "eagle3", "name": "...", "fingerprint": "sha256:..."},
      "probe":   {"depth": 8, "width": 8, "num_prompts": 64, "num_samples": 5120},
      "criterion": "youden",            # how tau_d was chosen
      "auc_min": 0.7,                    # xi: depths with AUC_d > xi are sweet spots
      "depths": [                        # one row per probed draft depth d = 1..probe.depth
        {"depth": 1, "auc": 0.91, "auc_ci": [0.89, 0.93], "accept_rate": 0.62,
         "num_accepted": 3170, "num_rejected": 1950, "threshold": 0.31}
      ],
      "sweet_spots": [1, 3, 8],          # D_sig (Eq. 7); every listed depth has a row above
      "k_max": 96,                       # K_max from the verify-cost knee (Eq. 2), or null
      "device": {"kind": "cuda", "name": "NVIDIA H200"}  # where that knee was measured
    }

Depth ``d`` counts drafted tokens: d = 1 is the root's children (the paper's root gate).
Fingerprints tie a file to the exact model and drafter weights; :func:`load_calibration` refuses
a file made for something else rather than silently gating with meaningless thresholds. The
thresholds hold on any device; ``k_max`` only on the ``device`` it was measured on (a file
without one sets no cap: :func:`sglang_echo.core.kmax.resolve_kmax`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

SCHEMA = "sglang-echo/calibration"
VERSION = 1


class CalibrationError(ValueError):
    """A calibration file is missing, malformed, or made for another model/drafter."""


@dataclass(frozen=True)
class DepthStats:
    depth: int
    auc: float
    auc_ci: tuple[float, float]
    accept_rate: float
    num_accepted: int
    num_rejected: int
    threshold: float


@dataclass(frozen=True)
class Calibration:
    model: dict
    drafter: dict
    depths: tuple[DepthStats, ...]
    sweet_spots: tuple[int, ...]
    criterion: str = "youden"
    auc_min: float = 0.7
    probe: dict = field(default_factory=dict)
    k_max: Optional[int] = None
    device: Optional[dict] = None  # {"kind", "name"} of the device k_max was measured on
    created: str = ""

    def threshold(self, depth: int) -> float:
        for row in self.depths:
            if row.depth == depth:
                return row.threshold
        raise CalibrationError(f"calibration has no row for depth {depth}")

    def to_json(self) -> dict:
        out = {"schema": SCHEMA, "version": VERSION, **asdict(self)}
        out["depths"] = [dict(asdict(r), auc_ci=list(r.auc_ci)) for r in self.depths]
        out["sweet_spots"] = list(self.sweet_spots)
        return out

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")


CONTENT_HASH_MAX_BYTES = 64 << 20  # weight files hashed by content: draft heads, not targets


def fingerprint(path: str | Path) -> str:
    """A cheap, stable identity for a model or drafter directory.

    Hashes config.json, the names and sizes of the weight files, and the contents of weight files
    up to :data:`CONTENT_HASH_MAX_BYTES`. Draft heads are that small, and a retrained head has the
    same config and sizes as the one it replaces, so only its bytes tell them apart (a calibration
    of the old head must not load for the new one). Hashing a target's gigabytes at every server
    start would be too slow to be worth the extra certainty: there the names and sizes stand in.
    """
    root = Path(path)
    h = hashlib.sha256()
    config = root / "config.json"
    if config.is_file():
        h.update(config.read_bytes())
    for f in sorted(root.glob("*.safetensors")) + sorted(root.glob("*.bin")) + sorted(root.glob("*.gguf")):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        if size <= CONTENT_HASH_MAX_BYTES:
            h.update(hashlib.sha256(f.read_bytes()).digest())
    return "sha256:" + h.hexdigest()


def local_dir(path: str | Path) -> Optional[Path]:
    """The local folder of a model or head: ``path`` itself, or for a Hugging Face hub id the
    snapshot already in the local cache (never downloaded here); None where neither exists."""
    if Path(path).is_dir():
        return Path(path)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(path), local_files_only=True))
    except Exception:  # not a hub id, or not in the cache
        return None


def _require(cond: bool, path: Path, msg: str) -> None:
    if not cond:
        raise CalibrationError(f"{path}: {msg}")


def load_calibration(
    path: str | Path,
    *,
    model_fingerprint: Optional[str] = None,
    drafter_fingerprint: Optional[str] = None,
    drafter_kind: Optional[str] = None,
) -> Calibration:
    """Read and validate a calibration file; refuse one made for another model or drafter."""
    p = Path(path)
    _require(p.is_file(), p, "calibration file not found (run echo-calibrate, or start without one to use defaults)")
    try:
        raw = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise CalibrationError(f"{p}: not valid JSON ({e})") from None
    _require(isinstance(raw, dict) and raw.get("schema") == SCHEMA, p, f"not a {SCHEMA} file")
    _require(raw.get("version") == VERSION, p, f"schema version {raw.get('version')!r}, this build reads {VERSION}")
    try:
        depths = tuple(
            DepthStats(
                depth=int(r["depth"]),
                auc=float(r["auc"]),
                auc_ci=(float(r["auc_ci"][0]), float(r["auc_ci"][1])),
                accept_rate=float(r["accept_rate"]),
                num_accepted=int(r["num_accepted"]),
                num_rejected=int(r["num_rejected"]),
                threshold=float(r["threshold"]),
            )
            for r in raw["depths"]
        )
        calib = Calibration(
            model=dict(raw["model"]),
            drafter=dict(raw["drafter"]),
            depths=depths,
            sweet_spots=tuple(int(d) for d in raw["sweet_spots"]),
            criterion=str(raw.get("criterion", "youden")),
            auc_min=float(raw.get("auc_min", 0.7)),
            probe=dict(raw.get("probe", {})),
            k_max=None if raw.get("k_max") is None else int(raw["k_max"]),
            device=None
            if raw.get("device") is None
            else {"kind": str(raw["device"]["kind"]), "name": str(raw["device"]["name"])},
            created=str(raw.get("created", "")),
        )
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise CalibrationError(f"{p}: malformed calibration ({type(e).__name__}: {e})") from None
    known = {r.depth for r in depths}
    _require(all(d >= 1 for d in known), p, "depths start at 1 (the root's children)")
    _require(set(calib.sweet_spots) <= known, p, f"sweet spots {calib.sweet_spots} lack rows in 'depths'")
    _require(all(0.0 <= r.threshold <= 1.0 for r in depths), p, "thresholds are probabilities in [0, 1]")
    got_kind = calib.drafter.get("kind")
    _require(
        drafter_kind is None or drafter_kind == got_kind,
        p,
        f"made for the {got_kind!r} drafter, the server drafts with {drafter_kind!r}; "
        f"re-run echo-calibrate --drafter {drafter_kind}",
    )
    for what, expected, got in (
        ("model", model_fingerprint, calib.model.get("fingerprint")),
        ("drafter", drafter_fingerprint, calib.drafter.get("fingerprint")),
    ):
        _require(
            expected is None or expected == got,
            p,
            f"made for a different {what} (file has {got}, running {what} is {expected}); re-run echo-calibrate",
        )
    return calib
