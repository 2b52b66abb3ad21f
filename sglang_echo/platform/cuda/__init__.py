"""sglang_echo.platform.cuda: the `sgl_kernel` sglang imports on a CUDA host without sglang-kernel.

Selected by `kernel_finder.platform_mode` (CUDA device, no real sglang-kernel, CPU engine not
selected). `sgl_kernel_shim.py` is the module sglang sees as `sgl_kernel`; `sgl_kernel_utils.py`,
`sgl_kernel_kvcacheio.py`, `sgl_kernel_quantization.py` its submodules. What is implemented:
`norms.py` (rmsnorm, fused_add_rmsnorm: sglang's JIT kernels where nvcc exists, else the Triton
kernel of `triton_norms.py`), `activations.py`, `tensors.py` (weak_ref_tensor); what only imports
and raises when called: `missing.py`. `hooks.py` registers the sglang hooks of CUDA mode and
`env.py` holds the environment defaults it sets. See ../README.md, "CUDA mode".
"""
