"""The engine-agnostic ECHO core: trees, gating, the elastic scheduler, packing, verification.

Pure PyTorch and vectorised over the batch, so the SGLang worker (GPU or CPU), the calibrator,
benchmarks and the replay simulator all run this one implementation.
"""

from .baselines import Autoregressive, BudgetedChain, Chain, StaticTree
from .calibration_file import Calibration, CalibrationError, DepthStats, fingerprint, load_calibration
from .factory import POLICIES, PolicyConfig, make_policy
from .gating import GatingConfig, layer_confidence
from .metrics import MetricsTotals, StepMetrics
from .pack import PackedBatch, PaddedTrees, pack
from .policy import BuildState, Frontier, TreeDrafter, TreePolicy, build_trees
from .scheduler import ElasticConfig, ElasticPolicy
from .tree import DETERMINISTIC, Candidates, DraftTrees, NodePool
from .verify import VerifyResult, greedy_verify, greedy_verify_padded, stochastic_verify

__all__ = [
    "Autoregressive",
    "BudgetedChain",
    "BuildState",
    "Calibration",
    "CalibrationError",
    "Candidates",
    "Chain",
    "DETERMINISTIC",
    "DepthStats",
    "DraftTrees",
    "ElasticConfig",
    "ElasticPolicy",
    "Frontier",
    "GatingConfig",
    "MetricsTotals",
    "NodePool",
    "POLICIES",
    "PackedBatch",
    "PaddedTrees",
    "PolicyConfig",
    "StaticTree",
    "StepMetrics",
    "TreeDrafter",
    "TreePolicy",
    "VerifyResult",
    "build_trees",
    "fingerprint",
    "greedy_verify",
    "greedy_verify_padded",
    "layer_confidence",
    "load_calibration",
    "make_policy",
    "pack",
    "stochastic_verify",
]
