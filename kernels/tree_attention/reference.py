"""PyTorch reference of tree-verify attention over the packed ragged layout.

Contract (the Triton and FlashInfer paths implement the same one; layout details in
:mod:`.metadata`): tree token ``t`` of request ``i`` attends to every cached prefix slot
``kv_indices[kv_indptr[i]:kv_indptr[i+1]]`` and to the tree tokens of request ``i`` whose bit is
set in ``packed_mask[t]`` (itself and its ancestors), whose K/V sit at ``tree_slots``.

* ``q [N, Hq, D]``, ``k_cache / v_cache [S, Hkv, D]`` (``Hq`` a multiple of ``Hkv``: GQA);
* scores are ``sm_scale * q.k`` in fp32, output ``[N, Hq, D]`` in ``q.dtype``;
* a row that sees no key at all (graph padding) outputs exactly 0, never NaN.

Vectorised: requests are padded to the widest tree / longest prefix of the batch and solved in
one batched einsum (reads two host sizes, so it is not graph-capturable; it is a test oracle).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .metadata import ragged_rows, unpack_bits


def tree_attention_reference(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    qo_indptr: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    tree_slots: Tensor,
    packed_mask: Tensor,
    sm_scale: float,
) -> Tensor:
    """Tree-verify attention, see the module docstring. Returns ``[N, Hq, D]``."""
    n, hq, d = q.shape
    hkv = k_cache.shape[1]
    if hq % hkv:
        raise ValueError(f"{hq} query heads are not a multiple of {hkv} KV heads")
    g = hq // hkv
    b = qo_indptr.numel() - 1
    out = torch.zeros_like(q)
    if n == 0 or b == 0:
        return out
    dev = q.device
    qo_lens = (qo_indptr[1:] - qo_indptr[:-1]).to(torch.int64)
    kv_lens = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int64)
    w, p = int(qo_lens.max()), int(kv_lens.max())  # host sizes of the padded view

    # Key slots of every request: [prefix (P) | tree (W)], with validity.
    pcol = torch.arange(p, device=dev)
    pvalid = pcol[None, :] < kv_lens[:, None]
    pidx = (kv_indptr[:-1].to(torch.int64)[:, None] + pcol).clamp(max=max(kv_indices.numel() - 1, 0))
    pslots = kv_indices[pidx] if kv_indices.numel() else torch.zeros_like(pidx)
    tcol = torch.arange(w, device=dev)
    tvalid = tcol[None, :] < qo_lens[:, None]
    tslots = tree_slots[(qo_indptr[:-1].to(torch.int64)[:, None] + tcol).clamp(max=n - 1)]
    slots = torch.cat(
        [torch.where(pvalid, pslots.to(torch.int64), 0), torch.where(tvalid, tslots.to(torch.int64), 0)], 1
    )
    keys = k_cache[slots].float()  # [B, L, Hkv, D]
    vals = v_cache[slots].float()

    req, loc = ragged_rows(qo_indptr, n)
    qp = torch.zeros(b, w, hkv, g, d, device=dev, dtype=torch.float32)
    qp[req, loc] = q.float().view(n, hkv, g, d)
    scores = torch.einsum("bwhgd,blhd->bhgwl", qp, keys) * sm_scale

    tree_vis = torch.zeros(b, w, w, dtype=torch.bool, device=dev)
    tree_vis[req, loc] = unpack_bits(packed_mask, w)
    visible = torch.cat([pvalid[:, None, :].expand(b, w, p), tree_vis & tvalid[:, None, :]], -1)
    scores = scores.masked_fill(~visible[:, None, None], float("-inf"))
    # Softmax that maps fully masked rows to 0 instead of NaN.
    m = scores.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(scores - m)
    denom = e.sum(-1, keepdim=True)
    probs = e / torch.where(denom > 0, denom, torch.ones_like(denom))
    o = torch.einsum("bhgwl,blhd->bwhgd", probs, vals)
    out[:] = o[req, loc].reshape(n, hq, d).to(q.dtype)
    return out
