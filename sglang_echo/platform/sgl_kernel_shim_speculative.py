"""`sgl_kernel.speculative` on CPU: imported by sglang/kernels/ops/speculative/reconstruct_tree.py."""

from sglang_echo.platform.ops.spec_tree import reconstruct_indices_from_tree_mask  # noqa: F401

__sglang_echo_shim__ = "cpu"
