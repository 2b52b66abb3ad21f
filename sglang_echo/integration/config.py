"""ECHO settings for the sglang plugin.

ServerArgs has no free-form field, so ECHO's own knobs travel as environment variables (they
reach every sglang subprocess). Resolution order, later wins:

1. documented defaults (below);
2. the standard speculative flags: ``--speculative-num-steps`` -> ``max_depth``,
   ``--speculative-eagle-topk`` -> ``w_max``, ``--speculative-num-draft-tokens`` -> ``width``;
3. the file named by ``SGLANG_ECHO_CONFIG`` (``.json`` or ``.toml``; a top-level table or an
   ``[echo]`` table), or inline JSON when the value starts with ``{``;
4. per-field environment overrides ``SGLANG_ECHO_<FIELD>`` (``SGLANG_ECHO_POLICY``,
   ``SGLANG_ECHO_K_MAX``, ...: every one is registered in :mod:`sglang_echo.env`, and any other
   ``SGLANG_ECHO_*`` variable, like an unknown key in the file, stops the server at start-up).

Defaults: policy ``echo``, ``k_max`` unset (the batch verification cap, roots included: see
below), ``max_depth`` 4, ``w_max`` 4, ``w_def`` half of ``w_max`` (2; measured at one request:
``benchmarks/results/serve-smollm2-tree-shape/``; a step narrows it to its budget's share per
request and depth, :mod:`sglang_echo.core.scheduler`), no calibration file (the paper's default
gates, logged loudly), drafter ``eagle3`` (the EAGLE-3 head of
``--speculative-draft-model-path``; ``dart``: a DART head there, :mod:`.dart`, with DART's
n-gram pruning unless ``dart_ngram`` is false; ``dflash``: a DFlash head there, :mod:`.dflash`;
``ngram``: the parameter-free n-gram drafter :class:`sglang_echo.drafters.ngram.NGramDrafter`,
no draft model); ``hybrid`` (off by default, on in ``make serve`` on a CPU): a head drafter's
trees also take each request's n-gram continuations (:mod:`sglang_echo.drafters.hybrid`,
:mod:`.hybrid`). The modes (``policy``, ``drafter``, ``verify``, ``budget``,
``control_kernel``) are enums whose members compare equal to their names.
``k_max``: a set value is the paper's fixed cap (Eq. 4). Unset, the server takes the
calibration's measured knee where it was measured on the same device, else the device's
default: 64 on a CPU, ``max(256, 2B)`` at batch ``B`` on a GPU
(:mod:`sglang_echo.core.kmax`, :func:`server_kmax`).
``width`` (the padded verify width W) defaults to the widest tree the policy can build:
``max(max_depth + 1, 1 + max_depth * w_def + w_max)``, within a set ``k_max``. ``verify``
``auto``: the target forward runs on the real tree nodes only (``ragged``, :mod:`.ragged`)
where the attention backend supports it (the CPU platform's), else on every request's ``W``
slots (``padded``, what CUDA graphs capture). ``budget`` ``fixed``: every step of a budgeted
policy (``echo``, ``dense-gating``, ``fixed-threshold``, ``budgeted-chain``) may verify up to
``K_max(B)``; ``cost``: each step's cap ``<= K_max(B)`` comes from a cost model the worker fits
while serving (:mod:`sglang_echo.core.budget`), down to plain decoding where drafting does not
pay; its K_max explorations come every 64 steps served at a load (batch-size half-octave),
backing off to ``explore_backoff`` (default 16) times that while they keep confirming plain
decoding there (1: every 64 steps).
``lazy_extend`` (default 128; EAGLE-3 and DART drafters, without overlap scheduling): a step
that drafts nothing skips EAGLE's draft extend, and the next step that may draft extends over
the skipped tokens first (:mod:`.lazy_extend`); a request's draft KV lags by at most that many
tokens (a full backlog is caught up at once), 0 turns it off.
``control_kernel`` (``echo``, ``dense-gating``, ``fixed-threshold``; CUDA only): ``torch`` runs
the scheduler as tensor ops, ``triton`` each draft depth as one Triton program
(:mod:`sglang_echo.kernels.control`; the same trees, about 60 fewer launches per depth; compiled
on first use for each power-of-two batch size).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, fields, replace
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any, Mapping, Optional

from sglang_echo import env
from sglang_echo.core.factory import ELASTIC_POLICIES, Policy
from sglang_echo.core.kmax import CPU_DEFAULT, Device, KMax, resolve_kmax
from sglang_echo.core.scheduler import ControlKernel

from .ragged import VerifyMode

log = logging.getLogger(__name__)

ENV_CONFIG = env.PREFIX + "CONFIG"
ENV_PREFIX = env.PREFIX


class Drafter(StrEnum):
    """Who proposes the tree nodes: a trained head (EAGLE-3, DART, DFlash) or the n-gram drafter."""

    EAGLE3 = "eagle3"
    DART = "dart"
    DFLASH = "dflash"
    NGRAM = "ngram"


class Budget(StrEnum):
    """How a budgeted policy's per-step cap is set (see the module docstring)."""

    FIXED = "fixed"
    COST = "cost"


DRAFTERS = tuple(Drafter)
BUDGETS = tuple(Budget)
# Policies whose tree grows by the elastic scheduler (frontier w_def, children w_max).
ELASTIC = ELASTIC_POLICIES


class EchoConfigError(ValueError):
    """An ECHO setting is invalid; the message names the setting and where it came from."""


@dataclass(frozen=True)
class EchoConfig:
    policy: Policy = Policy.ECHO
    k_max: Optional[int] = None  # None: the calibration's measured knee on this device, else the device's default
    max_depth: int = 4
    w_def: Optional[int] = None  # None: half of w_max, at least 1 (see w_default)
    w_max: int = 4
    width: Optional[int] = None  # None: derived (see module docstring)
    calibration: Optional[str] = None
    drafter: Drafter = Drafter.EAGLE3
    dart_ngram: bool = True  # drafter dart: DART's n-gram-enforced ranking (False: the logits alone)
    hybrid: bool = False  # drafters with a head: the request's n-gram drafter drafts into the same trees
    fixed_tau: float = 0.3
    verify: VerifyMode = VerifyMode.AUTO
    budget: Budget = Budget.FIXED  # cost: each step's cap from the measured cost model (budgeted policies)
    explore_backoff: int = 16  # budget cost: the longest gap between K_max explorations, in units of 64 steps
    lazy_extend: int = 128  # most tokens a plain step may leave out of the draft KV per request (0: off)
    control_kernel: ControlKernel = ControlKernel.AUTO  # the elastic scheduler as tensor ops or Triton (CUDA)
    source: str = "defaults"

    # -- derived ---------------------------------------------------------------------------
    @property
    def w_default(self) -> int:
        """Alg. 1's ``W_def``: ``w_def`` where set, else half of ``w_max`` (at least 1), so that a
        ``--speculative-eagle-topk`` alone sets a consistent shape (topk 2: a chain)."""
        return self.w_def if self.w_def is not None else max(1, self.w_max // 2)

    @property
    def max_tree_nodes(self) -> int:
        """Most nodes (root included) one request's tree can get under this policy."""
        if self.policy in ELASTIC:
            return 1 + self.max_depth * self.w_default + self.w_max
        if self.policy == "ar":
            return 1
        if self.policy == "static-tree":
            return self.width or self.max_depth + 1
        if self.policy == "beam-tree":
            return 1 + self.max_depth * self.w_max
        return 1 + self.max_depth  # chain, budgeted-chain

    @property
    def frontier_width(self) -> int:
        """Frontier slots per request the drafter must expand at one depth."""
        if self.policy in ELASTIC:
            return self.w_default
        if self.policy in ("static-tree", "beam-tree"):
            return self.w_max
        return 1

    @property
    def sglang_topk(self) -> int:
        """``--speculative-eagle-topk`` for this config: the children the draft worker takes per
        frontier slot, at least 2 (sglang's verify path needs a tree for topk >= 2)."""
        return max(2, self.w_max, self.frontier_width)

    def _within_k_max(self, nodes: int) -> int:
        """A tree of ``nodes`` never outgrows a configured K_max (one request alone may fill it)."""
        return nodes if self.k_max is None else min(self.k_max, nodes)

    def resolved_width(self) -> int:
        if self.width is not None:
            return self.width
        if self.policy == Policy.STATIC_TREE:
            return max(self.max_depth + 1, self._within_k_max(1 + self.max_depth * self.w_max))
        if self.policy == Policy.BEAM_TREE:  # unbudgeted: every depth's beam is verified (calibration)
            return 1 + self.max_depth * self.w_max
        return max(self.max_depth + 1, self._within_k_max(1 + self.max_depth * self.w_default + self.w_max))

    def validate(self) -> "EchoConfig":
        def bad(msg: str) -> EchoConfigError:
            return EchoConfigError(f"ECHO config ({self.source}): {msg}")

        for name, kind in _ENUMS.items():
            try:
                kind(getattr(self, name))
            except ValueError:
                raise bad(_unknown_choice(name, getattr(self, name), kind)) from None
        if self.k_max is not None and self.k_max < 1:
            raise bad(f"k_max={self.k_max} must be >= 1 (it counts every request's root)")
        if self.max_depth < 1:
            raise bad(f"max_depth={self.max_depth} must be >= 1 (use policy='ar' for no drafting)")
        if not 1 <= self.w_default <= self.w_max:
            raise bad(f"need 1 <= w_def <= w_max, got w_def={self.w_default}, w_max={self.w_max}")
        if self.w_max < 2:
            raise bad(f"w_max={self.w_max} must be >= 2 (the verify path needs a tree, topk >= 2)")
        if self.explore_backoff < 1:
            raise bad(f"explore_backoff={self.explore_backoff} must be >= 1 (1: explore every 64 steps)")
        if self.lazy_extend < 0:
            raise bad(f"lazy_extend={self.lazy_extend} must be >= 0 (0: extend the draft KV every step)")
        if self.control_kernel == ControlKernel.TRITON and self.policy not in ELASTIC:
            raise bad(
                f"control_kernel='triton' fuses the elastic scheduler ({', '.join(ELASTIC)}), "
                f"not policy '{self.policy}'"
            )
        if self.hybrid and self.drafter == Drafter.NGRAM:
            raise bad("hybrid adds the n-gram drafter to a head: set drafter to eagle3, dart or dflash")
        if not 0.0 <= self.fixed_tau <= 1.0:
            raise bad(f"fixed_tau={self.fixed_tau} must be a probability in [0, 1]")
        W = self.resolved_width()
        if W < self.max_depth + 1:
            raise bad(f"width={W} must be >= max_depth + 1 = {self.max_depth + 1}")
        if self.policy != Policy.STATIC_TREE and W < self.max_tree_nodes and W < (self.k_max or W + 1):
            raise bad(
                f"width={W} is smaller than the widest tree policy '{self.policy}' can build "
                f"({self.max_tree_nodes} nodes = 1 + max_depth*w_def + w_max); raise "
                "--speculative-num-draft-tokens / width or lower max_depth / w_max"
            )
        if self.calibration is not None and not Path(self.calibration).is_file():
            raise bad(
                f"calibration file {self.calibration!r} not found (run echo-calibrate, or unset "
                "it to gate with the documented defaults)"
            )
        return self

    def policy_config(self, k_max: Optional[int] = None):
        """The core policy's settings; ``k_max``: its own cap (default: the configured one, else a
        CPU's default). A server's worker gives every step the cap of its :class:`KMax`."""
        from sglang_echo.core.factory import PolicyConfig

        return PolicyConfig(
            k_max=k_max or self.k_max or CPU_DEFAULT.flat,
            max_depth=self.max_depth,
            w_def=self.w_default,
            w_max=self.w_max,
            topk=self.w_max,
            total_tokens=self.resolved_width(),
            fixed_tau=self.fixed_tau,
            control_kernel=ControlKernel.TORCH if self.control_kernel == ControlKernel.AUTO else self.control_kernel,
        )

    def describe(self) -> str:
        d = asdict(self)
        d["width"] = self.resolved_width()
        d["k_max"] = "auto" if self.k_max is None else self.k_max
        return ", ".join(f"{k}={v}" for k, v in d.items() if k != "source") + f" [{self.source}]"


_INT = {"k_max", "max_depth", "w_def", "w_max", "width", "lazy_extend", "explore_backoff"}
_FLOAT = {"fixed_tau"}
_BOOL = {"dart_ngram", "hybrid"}
_ENUMS: dict[str, type[Enum]] = {
    "policy": Policy,
    "drafter": Drafter,
    "verify": VerifyMode,
    "budget": Budget,
    "control_kernel": ControlKernel,
}
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}
_FIELDS = {f.name for f in fields(EchoConfig)} - {"source"}


def _unknown_choice(key: str, value: Any, kind: type[Enum]) -> str:
    return f"{key}={value!r} is unknown; choose one of {', '.join(m.value for m in kind)}"


def _coerce(key: str, value: Any, where: str) -> Any:
    if value is None:
        return None
    if key in _ENUMS:
        try:
            return _ENUMS[key](str(value))
        except ValueError:
            raise EchoConfigError(f"ECHO config ({where}): {_unknown_choice(key, value, _ENUMS[key])}") from None
    try:
        if key in _INT:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if key in _FLOAT:
            return float(value)
        if key in _BOOL:
            if isinstance(value, bool):
                return value
            if str(value).lower() in _TRUE | _FALSE:
                return str(value).lower() in _TRUE
            raise ValueError
        return str(value)
    except (TypeError, ValueError):
        kind = "integer" if key in _INT else "number" if key in _FLOAT else "boolean" if key in _BOOL else "string"
        raise EchoConfigError(f"ECHO config ({where}): {key}={value!r} is not a valid {kind}") from None


def _read_file(spec: str) -> tuple[dict, str]:
    if spec.lstrip().startswith("{"):
        where = f"${ENV_CONFIG} (inline JSON)"
        try:
            raw = json.loads(spec)
        except json.JSONDecodeError as e:
            raise EchoConfigError(f"ECHO config ({where}): not valid JSON ({e})") from None
    else:
        p = Path(spec).expanduser()
        where = f"{p}"
        if not p.is_file():
            raise EchoConfigError(f"ECHO config: ${ENV_CONFIG}={spec!r} does not name a file")
        try:
            if p.suffix == ".toml":
                import tomllib

                raw = tomllib.loads(p.read_text())
            else:
                raw = json.loads(p.read_text())
        except Exception as e:  # JSON or TOML syntax error
            raise EchoConfigError(f"ECHO config ({where}): cannot parse ({type(e).__name__}: {e})") from None
    if isinstance(raw, dict) and isinstance(raw.get("echo"), dict):
        raw = raw["echo"]
    if not isinstance(raw, dict):
        raise EchoConfigError(f"ECHO config ({where}): expected a table/object of settings")
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise EchoConfigError(f"ECHO config ({where}): unknown setting(s) {unknown}; known: {sorted(_FIELDS)}")
    return {k: _coerce(k, v, where) for k, v in raw.items()}, where


def load_config(
    *,
    num_steps: Optional[int] = None,
    topk: Optional[int] = None,
    num_draft_tokens: Optional[int] = None,
    environ: Optional[Mapping[str, str]] = None,
    validate: bool = True,
) -> EchoConfig:
    """Resolve (defaults < flags < file < env) and validate (unless told not to: the launcher sizes
    the KV pool from the tree shape alone and leaves the rest to the server); see the module
    docstring."""
    cfg, sources = EchoConfig(), []
    flags = {"max_depth": num_steps, "w_max": topk, "width": num_draft_tokens}
    flags = {k: v for k, v in flags.items() if v is not None}
    if flags:
        cfg, sources = replace(cfg, **flags), sources + ["--speculative-* flags"]
    try:
        env.check(environ)
    except env.EnvError as e:
        raise EchoConfigError(f"ECHO config (environment): {e}") from None
    spec = env.get(ENV_CONFIG, environ=environ)
    if spec:
        values, where = _read_file(spec)
        cfg, sources = replace(cfg, **values), sources + [where]
    overrides = {}
    for key in sorted(_FIELDS):
        raw = env.get(ENV_PREFIX + key.upper(), environ=environ)
        if raw is not None:
            overrides[key] = _coerce(key, raw, f"${ENV_PREFIX}{key.upper()}")
    if overrides:
        cfg, sources = replace(cfg, **overrides), sources + ["env " + ",".join(sorted(overrides))]
    cfg = replace(cfg, source=" < ".join(["defaults"] + sources))
    return cfg.validate() if validate else cfg


def configured_drafter(environ: Optional[Mapping[str, str]] = None) -> str:
    """The ``drafter`` setting alone (file < env; no flag maps to it), unvalidated.

    sglang asks the algorithm object's predicates (``is_eagle``, ``is_ngram``, ...) from many
    places, some before the server args are validated; they only need this one field.
    """
    drafter = EchoConfig.drafter
    spec = env.get(ENV_CONFIG, environ=environ)
    if spec:
        drafter = _read_file(spec)[0].get("drafter", drafter)
    raw = env.get(ENV_PREFIX + "DRAFTER", environ=environ)
    return drafter if raw is None else _coerce("drafter", raw, f"${ENV_PREFIX}DRAFTER")


def resolve_control_kernel(cfg: EchoConfig, device) -> EchoConfig:
    """``control_kernel: auto``, settled for a server on ``device``: the fused Triton kernels for the
    elastic policies on a GPU where they build exactly the eager steps there
    (:func:`sglang_echo.kernels.control.selfcheck.first_difference`), else tensor ops; logged."""
    if cfg.control_kernel != ControlKernel.AUTO:
        return cfg
    kernel, why = ControlKernel.TORCH, "not a GPU"
    if cfg.policy not in ELASTIC:
        why = f"policy {cfg.policy} has no fused kernels"
    elif str(device).startswith("cuda"):
        from sglang_echo.kernels.control.selfcheck import first_difference

        try:
            problem = first_difference(cfg.policy, cfg.policy_config(), device)
        except Exception as e:  # a kernel that does not even compile here
            problem = f"{type(e).__name__}: {e}"
        if problem is None:
            kernel, why = ControlKernel.TRITON, "they build exactly the eager steps on this GPU"
        else:
            why = f"their start-up check failed ({problem})"
            log.warning("ECHO: the fused control kernels are off: %s", why)
    log.info("ECHO: control plane %s (control_kernel auto: %s)", kernel, why)
    return replace(cfg, control_kernel=kernel)


def server_kmax(cfg: EchoConfig, calibration, device) -> KMax:
    """The batch's verification cap of a server on ``device`` (:func:`~sglang_echo.core.kmax.resolve_kmax`):
    the configured ``k_max``, else the calibration's where it was measured on this device, else the
    device's default; logged with its source."""
    measured = calibration.k_max if calibration is not None else None
    measured_on = Device.from_json(calibration.device) if calibration is not None else None
    kmax, set_aside = resolve_kmax(cfg.k_max, Device.of(device), measured, measured_on)
    if set_aside:
        log.warning("ECHO: %s", set_aside)
    log.info("ECHO: %s", kmax.describe())
    return kmax


def make_echo_policy(cfg: EchoConfig, calibration=None, kmax: Optional[KMax] = None):
    from sglang_echo.core.factory import make_policy

    fused = None
    if cfg.control_kernel == ControlKernel.TRITON:  # Triton is imported only where it runs
        from sglang_echo.kernels.control import TRITON as fused
    return make_policy(cfg.policy, cfg.policy_config(kmax.flat if kmax else None), calibration=calibration, fused=fused)


def make_step_budget(cfg: EchoConfig, policy, padded_width: Optional[int], kmax: Optional[KMax] = None):
    """The per-step cost-model cap for ``budget: cost`` (:mod:`sglang_echo.core.budget`), or None;
    it never exceeds ``kmax`` (default: the configured ``k_max``, else a CPU's default).

    ``padded_width``: W when the target verifies every request's W slots, None for ragged verify.
    """
    if cfg.budget != Budget.COST:
        return None
    if not policy.budgeted:
        log.warning("ECHO: budget=cost ignored: policy %s has no verification cap", cfg.policy)
        return None
    from sglang_echo.core.budget import CostModelBudget

    ceiling = kmax or KMax(cfg.k_max or CPU_DEFAULT.flat)
    return CostModelBudget(
        ceiling,
        policy.max_depth,
        padded_width=padded_width,
        explore_backoff=cfg.explore_backoff,
        max_drafts=cfg.resolved_width() - 1,  # the widest tree the policy builds, its root excluded
    )


def check_consistent(cfg: EchoConfig, steps: int, topk: int, num_draft_tokens: int) -> None:
    """The scheduler's server args must be what ``EchoSpecAlgo.handle_server_args`` set."""
    problems = []
    if steps != cfg.max_depth:
        problems.append(f"--speculative-num-steps={steps} but ECHO max_depth={cfg.max_depth}")
    if topk < cfg.sglang_topk:
        problems.append(f"--speculative-eagle-topk={topk} but ECHO needs {cfg.sglang_topk} (w_max={cfg.w_max})")
    if num_draft_tokens != cfg.resolved_width():
        problems.append(f"--speculative-num-draft-tokens={num_draft_tokens} but ECHO width={cfg.resolved_width()}")
    if problems:
        raise ValueError("ECHO: inconsistent speculative settings: " + "; ".join(problems))
