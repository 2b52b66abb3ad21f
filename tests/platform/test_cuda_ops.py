"""The CUDA mode's `sgl_kernel` ops against fp32 references: on CPU tensors (the Triton kernel under
the interpreter), and with ``-m gpu`` on CUDA (sglang's JIT path, the Triton path, CUDA graphs)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang_echo.platform.cuda import missing, norms, sgl_kernel_utils, tensors, triton_norms
from sglang_echo.platform.cuda import sgl_kernel_shim as shim

EPS = 1e-6
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# 1 and 7: masked single chunk; 300: two warps' worth; 5000 > MAX_BLOCK: the chunked two-pass loop.
HIDDEN = [1, 7, 300, 5000]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def ref_rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def ref_fused_add_rmsnorm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(new x, new residual): the norm of the fp32 sum, the sum rounded into the residual."""
    s = x.float() + r.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype), s.to(r.dtype)


def _case(rows: int, hidden: int, dtype: torch.dtype, device: str = "cpu", seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, hidden, generator=g) * 3).to(dtype).to(device)
    r = torch.randn(rows, hidden, generator=g).to(dtype).to(device)
    w = (torch.rand(hidden, generator=g) + 0.5).to(dtype).to(device)
    return x, r, w


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_rmsnorm_matches_reference(triton_interpret, dtype, hidden) -> None:
    x, _, w = _case(3, hidden, dtype)
    out = torch.full_like(x, float("nan"))
    triton_norms.rmsnorm_rows(x, w, out, EPS)
    torch.testing.assert_close(out, ref_rmsnorm(x, w))


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rmsnorm_is_in_place(triton_interpret, dtype, hidden) -> None:
    x, r, w = _case(4, hidden, dtype, seed=hidden)
    want_x, want_r = ref_fused_add_rmsnorm(x, r, w)
    x_ptr, r_ptr = x.data_ptr(), r.data_ptr()
    assert shim.fused_add_rmsnorm(x, r, w, EPS) is None
    assert (x.data_ptr(), r.data_ptr()) == (x_ptr, r_ptr)
    torch.testing.assert_close(r, want_r, **_exact(dtype))  # the residual is the rounded sum
    torch.testing.assert_close(x, want_x)


def _exact(dtype: torch.dtype) -> dict:
    """Bit-exact, except bf16 under Triton's CPU interpreter: it rounds fp32 -> bf16 toward zero (a GPU
    to nearest even), one unit in the last place at most."""
    if dtype == torch.bfloat16 and not torch.cuda.is_available():
        return dict(rtol=2**-7, atol=0)
    return dict(rtol=0, atol=0)


def test_fused_add_normalises_the_fp32_sum(triton_interpret) -> None:
    """FlashInfer's semantics: the norm reads the unrounded sum, not the fp16 residual just stored
    (fp16: Triton's interpreter rounds it as a GPU does, see `_exact`)."""
    x, r, w = _case(64, 256, torch.float16, seed=3)
    x, r = x * 100, r * 1e-2  # the small addend partly rounds away in fp16 (not in fp32)
    s = x.float() + r.float()
    from_rounded = ref_rmsnorm(s.to(torch.float16), w)
    want_x, _ = ref_fused_add_rmsnorm(x, r, w)
    assert not torch.equal(want_x, from_rounded)  # the case distinguishes the two
    shim.fused_add_rmsnorm(x, r, w, EPS)
    assert (x != want_x).sum() <= (x != from_rounded).sum() // 4


def test_rmsnorm_signature_out_strides_and_3d(triton_interpret) -> None:
    x, _, w = _case(6, 96, torch.bfloat16)
    got = shim.rmsnorm(x, w, EPS)  # sgl_kernel's: a new tensor, the input untouched
    assert got.data_ptr() != x.data_ptr()
    torch.testing.assert_close(got, ref_rmsnorm(x, w))
    wide = torch.zeros(6, 160, dtype=torch.bfloat16)
    strided_in = wide[:, 32:128]
    strided_in.copy_(x)
    out = torch.zeros(6, 200, dtype=torch.bfloat16)[:, :96]  # rows 200 apart
    assert shim.rmsnorm(strided_in, w, EPS, out=out) is out
    torch.testing.assert_close(out, ref_rmsnorm(x, w))
    x3 = x.view(2, 3, 96)
    torch.testing.assert_close(shim.rmsnorm(x3, w, EPS), ref_rmsnorm(x3, w))
    assert shim.rmsnorm(x[:0], w, EPS).shape == (0, 96)


def test_rmsnorm_rejects_bad_shapes(triton_interpret) -> None:
    x, _, w = _case(2, 16, torch.float32)
    with pytest.raises(ValueError, match="weight"):
        triton_norms.rmsnorm_rows(x, w[:8], x, EPS)
    with pytest.raises(ValueError, match="contiguous last dim"):
        triton_norms.rmsnorm_rows(x, w, torch.empty(16, 2).t(), EPS)


class _FakeCuda:
    """What `_dispatch` reads of a tensor, for a CUDA tensor on a machine without one."""

    def __init__(self, hidden: int, dtype: torch.dtype = torch.bfloat16) -> None:
        self.is_cuda, self.dtype, self.shape = True, dtype, (4, hidden)


def test_dispatch_keeps_jit_per_key_and_falls_back_once(monkeypatch) -> None:
    monkeypatch.setattr(norms, "_chosen", {})
    monkeypatch.setattr(norms, "jit_toolchain_present", lambda: True)
    calls: list[str] = []
    ok = lambda: calls.append("jit")  # noqa: E731
    tri = lambda: calls.append("triton")  # noqa: E731

    def broken() -> None:
        calls.append("jit-failed")
        raise RuntimeError("unsupported hidden_size")

    w = torch.empty(0, dtype=torch.bfloat16)
    assert norms._dispatch("rmsnorm", _FakeCuda(4096), w, True, ok, tri) is norms.NormBackend.JIT
    assert norms._dispatch("rmsnorm", _FakeCuda(4096), w, True, ok, tri) is norms.NormBackend.JIT
    assert norms._dispatch("rmsnorm", _FakeCuda(4100), w, True, broken, tri) is norms.NormBackend.TRITON
    assert norms._dispatch("rmsnorm", _FakeCuda(4100), w, True, broken, tri) is norms.NormBackend.TRITON
    assert norms._dispatch("rmsnorm", _FakeCuda(4096), w, False, ok, tri) is norms.NormBackend.TRITON  # layout
    fp32 = _FakeCuda(4096, torch.float32)
    assert norms._dispatch("rmsnorm", fp32, w.float(), True, ok, tri) is norms.NormBackend.TRITON  # dtype
    assert calls == ["jit", "jit", "jit-failed", "triton", "triton", "triton", "triton"]
    monkeypatch.setattr(norms, "jit_toolchain_present", lambda: False)  # no nvcc: never tried
    assert norms._dispatch("rmsnorm", _FakeCuda(2048), w, True, broken, tri) is norms.NormBackend.TRITON


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "name,act",
    [
        ("silu_and_mul", F.silu),
        ("gelu_and_mul", F.gelu),
        ("gelu_tanh_and_mul", lambda a: F.gelu(a, approximate="tanh")),
    ],
)
def test_act_and_mul(name, act, dtype) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 3, 2 * 37, generator=g).to(dtype)  # 37: the width sglang's JIT kernel refuses
    want = (act(x[..., :37].float()) * x[..., 37:].float()).to(dtype)
    op = getattr(shim, name)
    torch.testing.assert_close(op(x), want, rtol=0, atol=0)
    out = torch.full((5, 3, 37), float("nan"), dtype=dtype)
    assert op(x, out) is out
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_weak_ref_tensor_aliases_without_owning() -> None:
    base = torch.arange(60, dtype=torch.bfloat16).reshape(6, 10)
    t = base[2:, ::3]  # offset and strides
    count = torch._C._storage_Use_Count(t.untyped_storage()._cdata)
    w = shim.weak_ref_tensor(t)
    assert torch._C._storage_Use_Count(t.untyped_storage()._cdata) == count
    assert (w.shape, w.stride(), w.storage_offset(), w.dtype, w.device) == (
        t.shape,
        t.stride(),
        t.storage_offset(),
        t.dtype,
        t.device,
    )
    assert torch.equal(w, t)
    t[1, 2] = -7
    assert w[1, 2] == -7
    w[0, 0] = 99
    assert base[2, 0] == 99
    assert tensors.weak_ref_tensor(torch.empty(0, 4)).shape == (0, 4)


def test_is_arch_support_pdl(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    for major, want in ((9, True), (10, True), (8, False)):
        sgl_kernel_utils._pdl_on.cache_clear()
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, m=major: (m, 0))
        assert sgl_kernel_utils.is_arch_support_pdl() is want
    monkeypatch.setattr(torch.version, "cuda", None)
    assert sgl_kernel_utils.is_arch_support_pdl() is False
    sgl_kernel_utils._pdl_on.cache_clear()


def test_missing_ops_import_and_raise_naming_the_op() -> None:
    import importlib

    for module, names in missing.MISSING.items():
        shim_module = importlib.import_module(
            {"sgl_kernel": "sglang_echo.platform.cuda.sgl_kernel_shim"}.get(
                module, f"sglang_echo.platform.cuda.{module.replace('.', '_')}"
            )
        )
        for name in names:
            message = rf"^{module}\.{name} is not provided by sglang-echo's platform"
            with pytest.raises(NotImplementedError, match=message):
                getattr(shim_module, name)(torch.zeros(1))


def test_renorm_ops_are_the_platform_torch_ops() -> None:
    """The CPU mode's top-k / top-p renorm (tested in test_spec_sampling.py) under sgl_kernel's names."""
    from sglang_echo.platform.ops import spec_sampling

    assert shim.top_k_renorm_prob is spec_sampling.top_k_renorm_prob
    assert shim.top_p_renorm_prob is spec_sampling.top_p_renorm_prob


# --- on a GPU (-m gpu) ------------------------------------------------------------------------


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("hidden", [4096, 4100, 576])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("backend", ["dispatch", "triton"])
def test_gpu_norms(hidden, dtype, backend) -> None:
    """4096 (Llama-8B) and 576 (SmolLM2) take sglang's JIT kernels where nvcc exists; 4100 cannot."""
    x, r, w = _case(33, hidden, dtype, device="cuda", seed=hidden)
    want = ref_rmsnorm(x, w)
    want_x, want_r = ref_fused_add_rmsnorm(x, r, w)
    if backend == "triton":
        out = torch.empty_like(x)
        triton_norms.rmsnorm_rows(x, w, out, EPS)
        triton_norms.rmsnorm_rows(x, w, x, EPS, residual=r)
    else:
        out = shim.rmsnorm(x, w, EPS)
        shim.fused_add_rmsnorm(x, r, w, EPS)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(r, want_r, rtol=0, atol=0)
    torch.testing.assert_close(x, want_x)


@pytest.mark.gpu
@needs_cuda
def test_gpu_norms_replay_in_a_cuda_graph() -> None:
    x, r, w = _case(16, 4096, torch.bfloat16, device="cuda", seed=5)
    x0, r0 = x.clone(), r.clone()
    out = torch.empty_like(x)
    for _ in range(2):  # warm up (JIT builds) outside the capture, as sglang does
        shim.rmsnorm(x0, w, EPS, out=out)
        shim.fused_add_rmsnorm(x0.clone(), r0.clone(), w, EPS)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        shim.rmsnorm(x, w, EPS, out=out)
        shim.fused_add_rmsnorm(x, r, w, EPS)
    x.copy_(x0)
    r.copy_(r0)
    graph.replay()
    torch.cuda.synchronize()
    want_x, want_r = ref_fused_add_rmsnorm(x0, r0, w)
    torch.testing.assert_close(out, ref_rmsnorm(x0, w))
    torch.testing.assert_close(r, want_r, rtol=0, atol=0)
    torch.testing.assert_close(x, want_x)


@pytest.mark.gpu
@needs_cuda
def test_gpu_weak_ref_and_activations() -> None:
    t = torch.randn(8, 64, device="cuda", dtype=torch.bfloat16)[:, 1:33]
    w = shim.weak_ref_tensor(t)
    assert w.is_cuda and w.data_ptr() == t.data_ptr() and w.stride() == t.stride()
    t.fill_(3)
    assert bool((w == 3).all())
    x = torch.randn(4, 2 * 37, device="cuda", dtype=torch.bfloat16)
    want = (F.silu(x[:, :37].float()) * x[:, 37:].float()).to(torch.bfloat16)
    torch.testing.assert_close(shim.silu_and_mul(x), want, rtol=0, atol=0)
    assert sgl_kernel_utils.is_arch_support_pdl() is (torch.cuda.get_device_capability()[0] >= 9)
