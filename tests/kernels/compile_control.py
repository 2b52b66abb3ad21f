"""Compile the control kernels for an H100 (sm_90) down to a cubin, without a GPU, and print
each one's resource usage, and the layout kernels' layout conversions of sub-32-bit tensors
over every tile size a launch can pick: catches what the CPU interpreter accepts but Triton's
compiler does not (Triton 3.6 lowers some 8-bit intra-warp conversions wrongly, see
``kernels/control/layout.py``). Run by ``test_control.py`` in a subprocess (the interpreter
must be off here)."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget

from sglang_echo.kernels.control import elastic, layout
from sglang_echo.kernels.control.tiles import block

FLOAT = {"cand_logprob", "pool_logprob", "pool_score", "trunc_conf", "out_score"}
BOOL = {
    "cand_valid",
    "pool_valid",
    "pool_keep",
    "active",
    "truncated",
    "out_active",
    "out_mask",
    "out_valid",
    "tree_mask",
    "valid",
}
INT = {"stride_c", "stride_f", "F", "stride_p", "stride_t", "B", "C", "start", "depth", "width", "P", "W"}
INT32 = {"out_sizes"}


def arg_type(name: str) -> str:
    if name in FLOAT or name in BOOL or name in INT32:
        return "*fp32" if name in FLOAT else "*i1" if name in BOOL else "*i32"
    return "i32" if name in INT else "fp32" if name == "tau" else "*i64"


# A layout conversion of a tensor of 1-16-bit elements (bools, bytes, halves).
NARROW = re.compile(r"ttg\.convert_layout [^\n]*?: tensor<[0-9x]*x(i1|i8|i16|f16|bf16)[,>]")


def compile_sm90(kernel, constexprs: dict, num_warps: int):
    """As a launch compiles it: pointer arguments 16-byte aligned (torch's allocations are)."""
    signature = {n: "constexpr" if n in constexprs else arg_type(n) for n in kernel.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names) if signature[n].startswith("*")}
    src = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=aligned)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps))


def narrow_conversions() -> dict:
    """``{kernel and tiles: narrow conversions}`` for every tile pair of the layout kernels."""
    rows = {}
    for bp, bw in itertools.product((2, 8, 32, 64, 128, 256), (2, 8, 16, 32, 64)):
        compiled = compile_sm90(layout._pad_pool_kernel, dict(BLOCK_P=bp, BLOCK_W=bw), layout._warps(bw))
        rows[f"pad_pool BLOCK_P={bp} BLOCK_W={bw}"] = len(NARROW.findall(compiled.asm["ttgir"]))
    for bw in (2, 8, 16, 32, 64):
        compiled = compile_sm90(layout._dense_kernel, dict(BLOCK_W=bw), layout._warps(bw))
        rows[f"dense BLOCK_W={bw}"] = len(NARROW.findall(compiled.asm["ttgir"]))
    return rows


def usage(kernel, constexprs: dict, num_warps: int) -> str:
    compiled = compile_sm90(kernel, constexprs, num_warps)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True).stdout
    return next(line.strip() for line in out.splitlines() if "REG:" in line)


def main() -> None:
    rows = {}
    for batch, w_def, gated in ((64, 1, True), (256, 1, True), (256, 2, False)):
        cx = dict(
            GATED=gated,
            HAS_DRAFTER=True,
            HAS_PROPOSAL=True,
            W_DEF=w_def,
            W_MAX=4,
            BLOCK_B=block(batch),
            BLOCK_C=block(w_def * 4),
            CHUNK_B=elastic.CHUNK,
            LIBDEVICE=True,
        )
        label = f"depth B={batch} W_def={w_def} gated={gated}"
        rows[label] = usage(elastic._elastic_depth_kernel, cx, elastic._warps(batch))
    for batch in (64, 256):
        cx = dict(W_MAX=3, BLOCK_W=4, BLOCK_B=block(batch), CHUNK_B=elastic.CHUNK)
        rows[f"select B={batch}"] = usage(elastic._elastic_select_kernel, cx, elastic._warps(batch))
    for pool, width in ((33, 13), (129, 27)):  # ECHO's pools and widths at W = 1/4 and 2/8, depth 8
        rows[f"pad_pool P={pool} W={width}"] = usage(
            layout._pad_pool_kernel, dict(BLOCK_P=block(pool), BLOCK_W=block(width)), layout._warps(width)
        )
        rows[f"dense W={width}"] = usage(layout._dense_kernel, dict(BLOCK_W=block(width)), layout._warps(width))
    json.dump(dict(usage=rows, narrow=narrow_conversions(), triton=triton.__version__), sys.stdout, indent=1)


if __name__ == "__main__":
    main()
