"""Pure-torch stand-ins for the `sgl_kernel` CPU ops sglang's CPU path calls.

Each op mirrors one sglang Triton kernel (cited in its docstring) and keeps the sgl_kernel
signature, mutating its output tensors in place exactly like the compiled op.
"""

from sglang_echo.platform.ops.kv_cache import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    copy_all_layer_kv_cache_cpu,
)
from sglang_echo.platform.ops.spec_accept import (
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    verify_tree_greedy_cpu,
)
from sglang_echo.platform.ops.spec_sampling import (
    top_k_renorm_prob,
    top_p_renorm_prob,
    tree_speculative_sampling_target_only,
)
from sglang_echo.platform.ops.spec_tree import (
    build_tree_kernel_efficient_cpu,
    reconstruct_indices_from_tree_mask,
)

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "reconstruct_indices_from_tree_mask",
    "top_k_renorm_prob",
    "top_p_renorm_prob",
    "tree_speculative_sampling_target_only",
    "verify_tree_greedy_cpu",
]
