"""The `sgl_kernel` module sglang sees on a CPU without the real package (see kernel_finder).

Exposes exactly the `*_cpu` entry points sglang's CPU / speculative / KV-cache paths import.
A name sglang asks for that we do not implement raises ImportError at import time (loud),
instead of failing mid-request.

Deliberately NOT provided: `torch.ops.sgl_kernel.convert_weight_packed`. sglang's
`cpu_has_amx_support()` keys the Intel AMX fast paths (packed linear, fused rmsnorm/rope,
fused MoE ...) on it, so without it every layer uses its pure-torch `forward_native`.
"""

from sglang_echo.platform.ops import (  # noqa: F401
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_tree_kernel_efficient_cpu,
    copy_all_layer_kv_cache_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    reconstruct_indices_from_tree_mask,
    # Sampling verify, under the names sgl_kernel exports them (sglang imports them from
    # sgl_kernel on MUSA). sglang's CPU path sets them to None instead of importing them, so the
    # platform plugin binds them into eagle_utils (plugin._bind_verify_sampling_ops).
    top_k_renorm_prob,
    top_p_renorm_prob,
    tree_speculative_sampling_target_only,
    verify_tree_greedy_cpu,
)

# Lets `sgl_kernel.speculative` resolve as a submodule through the finder.
__path__: list[str] = []
__version__ = "0.0.0+sglang_echo.cpu"
__sglang_echo_shim__ = "cpu"
