"""Offline (engine-agnostic) speculative decoding: an HF transformers target and a gpt-fast-style
step loop, used to measure acceptance and to calibrate without an sglang server.

* :class:`~sglang_echo.eval.target.HFTarget`: prefill, tree verification in one forward, KV commit.
* :func:`~sglang_echo.eval.loop.speculative_generate` / :func:`~sglang_echo.eval.loop.autoregressive_generate`.
"""

from .loop import (
    GenerationResult,
    autoregressive_generate,
    policy_k_max,
    speculative_generate,
)
from .target import HFTarget

__all__ = ["GenerationResult", "HFTarget", "autoregressive_generate", "policy_k_max", "speculative_generate"]
