"""ECHO kernels (imported as ``sglang_echo.kernels``; never a top-level ``kernels`` package).

* :mod:`sglang_echo.kernels.tree_attention`: ragged tree-verify attention (reference, Triton,
  FlashInfer paths, CUDA-graph buffers, metadata builders);
* :mod:`sglang_echo.kernels.control`: ECHO's per-depth control plane as one Triton program
  (``make_policy(..., fused=sglang_echo.kernels.control.TRITON)``);
* :mod:`sglang_echo.kernels.sglang_backend`: the ``echo_tree_triton`` sglang attention backend;
* :mod:`sglang_echo.kernels.bench`: verify-attention benchmark (GPU).
* :mod:`sglang_echo.kernels.verify_cost`: target verify and draft cost curves for replay (GPU).

Nothing heavy is imported here: Triton modules must be imported after ``TRITON_INTERPRET`` is
set when they run on CPU.
"""
