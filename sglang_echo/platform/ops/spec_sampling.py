"""Stochastic (temperature > 0) speculative verification ops (sgl_kernel signatures, pure torch).

`tree_speculative_sampling_target_only` mirrors the CUDA kernel
`TreeSpeculativeSamplingTargetOnly` (sglang/kernels/jit/include/sgl_kernel/speculative/sampling.cuh,
wrapped by sglang/kernels/ops/speculative/sampling.py), which sglang's `eagle_sample` calls with
``draft_probs = zeros`` ("target only": every draft token is a point mass). Per request:

* Walk down from the root (local slot 0). At node ``c`` (target distribution ``p = target_probs[c]``)
  the children are tried in sibling-list order with ONE coin ``u = uniform_samples[c]`` and a
  running sum: child ``x_i`` is accepted iff ``p(x_i) > 0`` and
  (``u < (p(x_1) + ... + p(x_i)) / threshold_acc`` or ``p(x_i) >= threshold_single``). With the
  default thresholds (1, 1) and distinct sibling tokens this accepts ``x_i`` with probability
  exactly ``p(x_i)``: the point-mass rule of `sglang_echo.core.verify`. On acceptance
  ``predicts[retrive_index[c]] = x_i``, the child is appended to ``accept_index`` and its own coin
  is used one level down; a rejected child's token gets ``draft_probs[c, x] = p(x)``.
* At most ``accept_index.shape[1] - 1`` drafts are accepted. The bonus token at the last accepted
  node ``c`` is drawn by inverse CDF with ``uniform_samples_for_final_sampling`` from
  ``relu(p - draft_probs[c])`` (the residual: ``p`` minus the rejected children), or from ``p``
  itself when the depth limit was reached (the kernel's "no draft_probs for the bonus token").
  Inverse CDF as flashinfer's ``DeviceSamplingFromProb``: the first token with positive mass whose
  inclusive CDF exceeds ``u * sum``; if none (rounding), the last token with positive mass, else
  ``V - 1``. ``predicts[retrive_index[c]]`` = the bonus; other ``predicts`` entries are untouched.

One deliberate difference: a child whose token already appeared among its EARLIER siblings has no
mass left in the residual, so it is never accepted here. The kernel reads ``p(x)`` again for it,
which accepts ``x`` with up to twice its target probability (not lossless). The two agree whenever
sibling tokens are distinct, which EAGLE's top-k trees guarantee; ECHO trees built from several
drafters may repeat a token, and this rule keeps them exact.

Vectorised over requests and nodes; the Python loop runs over tree depth only.

`top_k_renorm_prob` / `top_p_renorm_prob` stand in for flashinfer's ``top_{k,p}_renorm_probs``
(the names ``sgl_kernel`` exports), which `eagle_sample` applies to the target probabilities before
verifying. Top-k keeps every token with probability ``>=`` the ``k``-th
largest (ties included, as flashinfer); top-p keeps every token whose exclusive cumulative
probability in descending order is ``<= top_p`` (the rule of sglang's CPU sampler,
`sglang.srt.layers.sampler.top_k_top_p_min_p_sampling_from_probs_torch`); both renormalise.
"""

from __future__ import annotations

from typing import Union

import torch

from sglang_echo.platform.ops.tree_links import chain_parent_and_rank


def tree_speculative_sampling_target_only(
    predicts: torch.Tensor,  # mutable [bs * n]
    accept_index: torch.Tensor,  # mutable [bs, num_spec]
    accept_token_num: torch.Tensor,  # mutable [bs]
    candidates: torch.Tensor,  # [bs, n]
    retrive_index: torch.Tensor,  # [bs, n]
    retrive_next_token: torch.Tensor,  # [bs, n]
    retrive_next_sibling: torch.Tensor,  # [bs, n]
    uniform_samples: torch.Tensor,  # [bs, n]
    uniform_samples_for_final_sampling: torch.Tensor,  # [bs]
    target_probs: torch.Tensor,  # [bs, n, V]
    draft_probs: torch.Tensor,  # mutable [bs, n, V] (zeros from eagle_sample)
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,  # the kernel's scan flavour; no effect on the result here
) -> None:
    if not (0.0 <= threshold_single <= 1.0 and 0.0 <= threshold_acc <= 1.0):
        raise ValueError(f"thresholds must be in [0, 1], got {threshold_single=}, {threshold_acc=}")
    bs, n = candidates.shape
    if bs == 0:
        return
    num_spec = accept_index.shape[1]
    vocab = target_probs.shape[-1]
    dev = candidates.device
    thr_acc = max(float(threshold_acc), 1e-9)  # as the kernel launcher clamps it

    parent, rank = chain_parent_and_rank(retrive_next_token, retrive_next_sibling)
    cand = candidates.to(torch.int64)
    ridx = retrive_index.to(torch.int64)
    rows = torch.arange(bs, device=dev)
    slots = torch.arange(n, device=dev)

    # p_parent(x) for every node x; 0 for the root / unreachable slots and for a token that an
    # earlier sibling already carries (its residual mass is gone: see the module docstring).
    dup = (
        (parent[:, :, None] == parent[:, None, :])
        & (cand[:, :, None] == cand[:, None, :])
        & (rank[:, None, :] < rank[:, :, None])
    ).any(-1)
    mass = target_probs[rows[:, None], parent.clamp(min=0), cand].to(torch.float32)
    mass = torch.where((parent >= 0) & ~dup, mass, torch.zeros_like(mass))

    cur = torch.zeros(bs, dtype=torch.int64, device=dev)  # local slot of the last accepted node
    last = ridx[:, 0].clone()  # its flat index (into predicts)
    coin = uniform_samples[:, 0].to(torch.float32)
    active = torch.ones(bs, dtype=torch.bool, device=dev)
    num_acc = torch.zeros(bs, dtype=torch.int64, device=dev)
    accept_index[:, 0] = last.to(accept_index.dtype)
    pflat = predicts.view(-1)

    for _level in range(1, num_spec):
        is_child = (parent == cur[:, None]) & active[:, None]
        order = torch.where(is_child, rank, n + rank).argsort(dim=1, stable=True)  # children first, in list order
        child_sorted = is_child.gather(1, order)
        m = torch.where(child_sorted, mass.gather(1, order), 0.0)
        ok = child_sorted & (m > 0) & ((coin[:, None] < m.cumsum(1) / thr_acc) | (m >= threshold_single))
        hit = ok.any(1)
        pos = ok.to(torch.int8).argmax(1)  # first accepted position in list order
        # Rejected children (tried before the accepted one, or all of them): residual at cur.
        n_rej = torch.where(hit, pos, child_sorted.sum(1))
        rb, rk = torch.nonzero(slots[None, :] < n_rej[:, None], as_tuple=True)
        if rb.numel():
            tok = cand[rb, order[rb, rk]]
            draft_probs[rb, cur[rb], tok] = target_probs[rb, cur[rb], tok].to(draft_probs.dtype)
        if not bool(hit.any()):
            break
        child = order[rows, pos]
        sel = rows[hit]
        pflat[last[sel]] = cand[sel, child[sel]].to(predicts.dtype)
        num_acc += hit.to(torch.int64)
        new_last = ridx[rows, child]
        accept_index[sel, num_acc[sel]] = new_last[sel].to(accept_index.dtype)
        last = torch.where(hit, new_last, last)
        cur = torch.where(hit, child, cur)
        coin = torch.where(hit, uniform_samples[rows, child].to(torch.float32), coin)
        active &= hit

    accept_token_num[:bs] = num_acc.to(accept_token_num.dtype)

    # Bonus token from relu(p - draft_probs) at the last accepted node (p alone at full depth).
    p = target_probs[rows, cur].to(torch.float32)
    q = draft_probs[rows, cur].to(torch.float32)
    q = torch.where((num_acc == num_spec - 1)[:, None], 0.0, q)
    resid = (p - q).clamp_min(0.0)
    u = uniform_samples_for_final_sampling.to(torch.float32) * resid.sum(1)
    valid = resid > 0
    found = (resid.cumsum(1) > u[:, None]) & valid
    first = found.to(torch.int8).argmax(1)
    last_valid = torch.where(valid.any(1), vocab - 1 - valid.flip(1).to(torch.int8).argmax(1), vocab - 1)
    sampled = torch.where(found.any(1), first, last_valid)
    pflat[last] = sampled.to(predicts.dtype)


def _per_row(value: Union[torch.Tensor, float, int], rows: int, dtype, device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return (
            value.reshape(-1).to(device=device, dtype=dtype).expand(rows)
            if value.numel() == 1
            else value.reshape(-1).to(device=device, dtype=dtype)
        )
    return torch.full((rows,), value, dtype=dtype, device=device)


def top_k_renorm_prob(probs: torch.Tensor, top_k: Union[torch.Tensor, int]) -> torch.Tensor:
    """Keep each row's tokens with probability >= its ``top_k``-th largest (ties at the pivot are
    kept, as flashinfer's ``top_k_renorm_probs``; ``top_k >= V`` keeps all), renormalise."""
    n, vocab = probs.shape
    k = _per_row(top_k, n, torch.int64, probs.device)
    limited = (k > 0) & (k < vocab)
    if not bool(limited.any()):
        return probs.clone()
    kmax = int(k[limited].max())
    vals = probs.topk(kmax, dim=-1, sorted=True).values
    pivot = vals.gather(1, (k.clamp(1, kmax) - 1)[:, None])
    kept = torch.where(probs >= pivot, probs, 0.0)
    kept = kept / kept.sum(-1, keepdim=True)
    return torch.where(limited[:, None], kept, probs)


def top_p_renorm_prob(probs: torch.Tensor, top_p: Union[torch.Tensor, float]) -> torch.Tensor:
    """Keep the tokens whose exclusive cumulative probability (descending) is ``<= top_p``, renormalise."""
    n, _vocab = probs.shape
    ps = _per_row(top_p, n, probs.dtype, probs.device)
    limited = ps < 1.0
    if not bool(limited.any()):
        return probs.clone()
    out = probs.clone()
    sub = probs[limited]
    srt, idx = sub.sort(dim=-1, descending=True)
    srt = torch.where((srt.cumsum(-1) - srt) > ps[limited][:, None], 0.0, srt)
    srt = srt / srt.sum(-1, keepdim=True)
    out[limited] = torch.zeros_like(sub).scatter_(-1, idx, srt)
    return out
