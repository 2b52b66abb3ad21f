"""Build any tree policy by name, so the worker, benchmarks and tests share one vocabulary."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Optional

from .baselines import Autoregressive, BeamTree, BudgetedChain, Chain, StaticTree
from .calibration_file import Calibration
from .gating import GatingConfig
from .policy import TreePolicy
from .scheduler import KERNELS, ControlKernel, ElasticConfig, ElasticPolicy, FusedControl


class Policy(StrEnum):
    """Every tree policy by name (members compare equal to their names)."""

    AR = "ar"
    CHAIN = "chain"
    STATIC_TREE = "static-tree"
    ECHO = "echo"
    DENSE_GATING = "dense-gating"
    FIXED_THRESHOLD = "fixed-threshold"
    BUDGETED_CHAIN = "budgeted-chain"
    BEAM_TREE = "beam-tree"


POLICIES = tuple(Policy)
ELASTIC_POLICIES = (Policy.ECHO, Policy.DENSE_GATING, Policy.FIXED_THRESHOLD)  # ElasticPolicy: Alg. 1, ablations


@dataclass(frozen=True)
class PolicyConfig:
    k_max: int = 64  # batch verification cap, roots included (Eq. 4)
    max_depth: int = 8
    w_def: int = 1
    w_max: int = 4
    topk: int = 10  # static tree; beam tree: its width
    total_tokens: int = 60  # static tree, root included
    fixed_tau: float = 0.3  # fixed-threshold ablation
    control_kernel: str = "torch"  # ECHO and its ablations: "triton" fuses each depth (GPU; kernels/control)


def make_policy(
    name: str,
    config: PolicyConfig = PolicyConfig(),
    gating: Optional[GatingConfig] = None,
    calibration: Optional[Calibration] = None,
    fused: Optional[FusedControl] = None,
) -> TreePolicy:
    """``gating`` overrides the sweet spots; otherwise they come from ``calibration`` or defaults.
    ``config.control_kernel == "triton"`` runs ECHO and its ablations on ``fused``, the kernels'
    :class:`~sglang_echo.core.scheduler.FusedControl` (``sglang_echo.kernels.control.TRITON``)."""
    if gating is None:
        gating = GatingConfig.from_calibration(calibration) if calibration else GatingConfig.default()
    elastic = ElasticConfig(config.k_max, config.max_depth, config.w_def, config.w_max)
    if config.control_kernel not in KERNELS:
        raise ValueError(f"unknown control kernel {config.control_kernel!r}; choose one of {', '.join(KERNELS)}")
    if config.control_kernel == ControlKernel.TRITON and fused is None:
        raise ValueError(
            "control_kernel 'triton' runs the kernels handed in: make_policy(..., "
            "fused=sglang_echo.kernels.control.TRITON)"
        )
    fused = fused if config.control_kernel == ControlKernel.TRITON else None
    if name == "ar":
        return Autoregressive()
    if name == "chain":
        return Chain(config.max_depth)
    if name == "static-tree":
        return StaticTree(config.max_depth, config.topk, config.total_tokens)
    if name == "echo":
        return ElasticPolicy(elastic, gating, "echo", fused)
    if name == "dense-gating":
        return ElasticPolicy(elastic, GatingConfig.dense(calibration, config.max_depth), "dense-gating", fused)
    if name == "fixed-threshold":
        return ElasticPolicy(elastic, GatingConfig.fixed(config.fixed_tau, gating.depths), "fixed-threshold", fused)
    if name == "beam-tree":
        return BeamTree(config.max_depth, config.topk)
    if name == "budgeted-chain":
        return BudgetedChain(config.k_max, config.max_depth)
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")


def max_tree_size(name: str, config: PolicyConfig = PolicyConfig()) -> int:
    """The most nodes one request's tree can hold under policy ``name``, root included: a padded
    width that never cuts a tree (:func:`~sglang_echo.core.pack.pad_pool`)."""
    d = config.max_depth
    sizes = {
        "ar": 1,
        "chain": d + 1,
        "budgeted-chain": d + 1,
        "static-tree": config.total_tokens,
        "beam-tree": 1 + d * config.topk,
    }
    # ECHO and its ablations: W_def per depth, then up to W_max more at the truncation depth (Alg. 1).
    return sizes.get(name, min(config.k_max, 1 + d * config.w_def + config.w_max))
