"""The `sgl_kernel` module sglang sees on a CUDA host without sglang-kernel (see kernel_finder).

Implemented (sgl_kernel's signatures and in-place semantics): `rmsnorm`, `fused_add_rmsnorm`
(norms.py), `silu_and_mul`, `gelu_and_mul`, `gelu_tanh_and_mul` (activations.py),
`weak_ref_tensor` (tensors.py), and `top_k_renorm_prob` / `top_p_renorm_prob` (the platform's
torch versions, shared with the CPU shim). Every other name sglang imports from `sgl_kernel` on
the CUDA path is a stub raising NotImplementedError (missing.py). A name in neither list raises
ImportError at import, as a missing op would with the real package.

What sglang routes elsewhere on CUDA and therefore needs nothing here: RoPE, EAGLE tree building,
greedy and sampled tree verification and n-gram tree reconstruction (sglang's own JIT kernels
under sglang/kernels/ops), draft/verify cache-location and KV-copy ops (Triton kernels in
sglang/kernels/ops/speculative and kvcache), attention (--attention-backend triton) and sampling
(--sampling-backend pytorch).
"""

from sglang_echo.platform.cuda import missing
from sglang_echo.platform.cuda.activations import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul  # noqa: F401
from sglang_echo.platform.cuda.norms import fused_add_rmsnorm, rmsnorm  # noqa: F401
from sglang_echo.platform.cuda.tensors import weak_ref_tensor  # noqa: F401
from sglang_echo.platform.ops.spec_sampling import top_k_renorm_prob, top_p_renorm_prob  # noqa: F401

globals().update(missing.stubs("sgl_kernel"))

# Lets `sgl_kernel.utils` etc. resolve as submodules through the finder.
__path__: list[str] = []
__version__ = "0.0.0+sglang_echo.cuda"
__sglang_echo_shim__ = "cuda"
