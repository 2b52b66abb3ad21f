"""`sgl_kernel.weak_ref_tensor`: a view of a tensor's memory that does not keep that memory alive.

sglang's breakable CUDA graphs (the default for prefill) and piecewise CUDA graphs weak-reference
the tensors a captured segment hands to the next (`runner_backend_utils/weak_ref_tensor.py`), so
the graph memory pool can reuse them; the pool itself stays pinned while any segment graph lives.
A plain reference would keep every captured intermediate allocated (correct, but the pool grows
with every captured batch size).

The view is built on a storage made from the data pointer alone
(`torch._C._construct_storage_from_data_pointer`, what torch's inductor CUDA-graph trees use for
the same purpose): it aliases the memory (writes either way are seen), has the tensor's dtype,
sizes, strides and storage offset, and leaves the original storage's reference count unchanged.
Any device (sgl_kernel's accepts CUDA tensors only); the caller keeps the memory valid.
"""

from __future__ import annotations

import torch


def weak_ref_tensor(tensor: torch.Tensor) -> torch.Tensor:
    storage = tensor.untyped_storage()
    borrowed = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), tensor.device, storage.nbytes())
    view = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    return view.set_(borrowed, tensor.storage_offset(), tensor.size(), tensor.stride())
