"""Batch-invariant attention over sglang's paged KV cache (``--enable-deterministic-inference``).

Guarantee: a query's output depends only on its own vector and the keys and values it sees, in
position order; not on which other requests share the forward, how long they are, how many
queries its own request brings (decode, prefill, prefix-cached extend, chain or tree verify), or
where its keys sit in the pool. So a tree node verified by ECHO gets the same bits as the token
decoded alone at that position, and one request's decoding is the same at 1 or 64 in flight.

Why the padded SDPA path (:mod:`.paged_sdpa`) cannot give that: torch's CPU kernels block a
query's softmax reduction by the *padded* key length, i.e. by the longest request in the batch,
and a tree-verify query reaches its ancestors through mask columns that decoding never has.

How: every query ``q`` at position ``p`` sees keys at positions ``t = 0..p`` (``t >= p - window``
too, with a sliding window). The keys are cut into fixed chunks of :data:`CHUNK` positions,
``[0, C), [C, 2C), ...``, each always computed at full width ``C`` (positions past ``p`` are
masked out, never dropped). Each chunk's softmax statistics are taken alone, then the chunks are
folded in position order into a float32 online softmax:

    s_c = scale * q . K_c      m_c = max s_c      l_c = sum exp(s_c - m_c)      o_c = exp(s_c - m_c) @ V_c
    m' = max(m, m_c)     l' = l * exp(m - m') + l_c * exp(m_c - m')     o' = likewise     out = o / l

A chunk that lies wholly past ``p`` leaves ``(m, l, o)`` bit for bit unchanged (``exp(0) = 1``,
its weights are exact zeros), so a batch's longer requests add no rounding to the shorter ones;
how many chunks are computed per matmul (a memory bound) does not change any chunk's bits.
The two products run as float32 batched matmuls whose reduction is ``D`` or ``C`` long; on MKL
they give each row the same bits whatever the number of rows from :data:`MIN_ROWS` up
(``tests/platform/test_invariant_attention.py`` checks exactly that, on this kernel). bf16
products are exact in float32, so only the summation order matters and it is fixed.

Key positions, not KV columns: a tree node at depth ``d`` over a prefix of ``P`` tokens sees the
prefix and its ancestors, which sit at scattered draft columns; its key list is rebuilt in
position order (ancestor at depth ``e`` at position ``P + e``), the list decoding that token sees.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_echo.platform.attention.paged_sdpa import gather_rows
from sglang_echo.platform.ops.ranges import ragged_ranges

CHUNK = 128
"""Key positions per chunk (the ``p @ V`` product reduces over it). float32 ``bmm`` (MKL, this host)
gives each row the same bits for any row count from :data:`MIN_ROWS` to 8192, 1-192 matrices,
1-2 threads, at chunks of 64, 128 and 256. 128: decoding 8-64 requests of 150-290 tokens costs
0.6-5.6 ms a layer (64: 0.5-4.5, 256: 0.7-20), and long contexts fold half as many chunks as 64."""
MIN_ROWS = 4
"""Rows per product at least (zero rows pad the rest): MKL's ``bmm`` sums 1, 2 or 3 rows in other
orders than 4 or more. A decoding request of a 3-KV-head model has ``group = 3`` rows per head."""


@dataclass(frozen=True)
class KeyLayout:
    """Where each query's keys are: queries in ``G`` groups of up to ``Q``; group ``g``'s key
    at position ``t`` is pool slot ``slots[g, t]``, and query ``(g, i)`` sees ``t <= qpos[g, i]``.

    A group is a request (causal modes: its queries share one key list) or a single tree node
    (tree verify: each node has its own ancestors). ``rows``/``cols`` place the packed queries of
    the forward into the ``[G, Q]`` grid, in order."""

    slots: torch.Tensor  # [G, L] int64
    qpos: torch.Tensor  # [G, Q] int64, -1 for padding
    rows: torch.Tensor  # [N] int64
    cols: torch.Tensor  # [N] int64


def causal_layout(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, q_lens: torch.Tensor, kv_lens: torch.Tensor
) -> KeyLayout:
    """Request b's ``q_lens[b]`` queries are its last positions ``kv_lens[b] - q_lens[b] ..``:
    decode, prefill, extend over a cached prefix, chain verify, draft extend and draft decode."""
    q_lens, kv_lens = q_lens.to(torch.int64), kv_lens.to(torch.int64)
    max_q, max_kv = int(q_lens.max()), int(kv_lens.max())
    slots = _request_slots(req_to_token, req_pool_indices, kv_lens, max_kv)
    i = torch.arange(max_q, device=q_lens.device)
    qpos = torch.where(i[None, :] < q_lens[:, None], (kv_lens - q_lens)[:, None] + i[None, :], -1)
    rows, cols = ragged_ranges(torch.zeros_like(q_lens), q_lens)
    return KeyLayout(slots, qpos, rows, cols)


def tree_layout(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    q_lens: torch.Tensor,
    visible: torch.Tensor,
) -> KeyLayout:
    """Tree verify: request b's draft node j has its KV at column ``prefix_lens[b] + j`` and sees
    the key columns ``visible[b, j]`` (``[bs, max_q, max_kv]`` bool: the prefix, its ancestors and
    itself); its first ``q_lens[b]`` nodes are queried. Each node is a group of one query at
    position ``P + depth``, whose ancestor at depth ``e`` is moved to position ``P + e``."""
    prefix, q_lens = prefix_lens.to(torch.int64), q_lens.to(torch.int64)
    n = visible.shape[1]
    ar = torch.arange(n, device=prefix.device)
    draft_cols = prefix[:, None] + ar[None, :]  # [bs, n]: KV column of draft node j
    real = ar[None, :] < q_lens[:, None]
    idx = draft_cols.clamp(max=visible.shape[2] - 1)[:, None, :].expand(-1, n, -1)
    draft_visible = visible.gather(2, idx) & real[:, None, :] & real[:, :, None]  # [bs, n, n]
    depth = draft_visible.sum(-1) - 1  # a node's ancestors, itself excluded
    b, j = ragged_ranges(torch.zeros_like(q_lens), q_lens)  # the queried nodes, packed
    width = int((prefix + q_lens).max())
    slots = _request_slots(req_to_token, req_pool_indices[b], prefix[b] + q_lens[b], width)
    slots = torch.cat([slots, slots.new_zeros(slots.shape[0], 1)], 1)  # column `width`: dropped
    pool_rows = req_pool_indices[b].to(torch.int64)[:, None]
    node_slots = req_to_token[pool_rows, draft_cols[b].clamp(max=req_to_token.shape[1] - 1)].to(torch.int64)
    dest = torch.where(draft_visible[b, j], prefix[b, None] + depth[b], width)
    slots.scatter_(1, dest, node_slots)
    qpos = (prefix[b] + depth[b, j])[:, None]
    return KeyLayout(slots[:, :width], qpos, torch.arange(b.numel(), device=b.device), torch.zeros_like(b))


def _request_slots(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, lens: torch.Tensor, width: int
) -> torch.Tensor:
    """``[G, width]`` pool slots of each group's first ``lens`` positions; slot 0 past them."""
    slots = req_to_token[req_pool_indices.to(torch.int64), :width].to(torch.int64)
    valid = torch.arange(width, device=slots.device)[None, :] < lens[:, None]
    return torch.where(valid, slots, 0)


def invariant_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    layout: KeyLayout,
    scaling: float,
    window: int | None = None,
    chunk: int = CHUNK,
) -> torch.Tensor:
    """``q`` ``[N, H, D]`` packed queries -> ``[N, H, Dv]`` in ``q``'s dtype (see the module doc)."""
    G, Q = layout.qpos.shape
    H, hkv, dv = q.shape[1], k_buffer.shape[1], v_buffer.shape[2]
    group = H // hkv  # query heads per KV head (GQA): head h reads KV head h // group
    qg, qpos = _query_matrices(q, layout, hkv)
    rows = qg.shape[2]
    n_chunks = max(1, -(-(int(qpos.max()) + 1) // chunk))
    slots = layout.slots[:, : n_chunks * chunk]
    if slots.shape[1] < n_chunks * chunk:
        slots = torch.cat([slots, slots.new_zeros(G, n_chunks * chunk - slots.shape[1])], 1)
    m = torch.full((G, hkv, rows, 1), float("-inf"), device=q.device)
    l_sum = torch.zeros(G, hkv, rows, 1, device=q.device)
    acc = torch.zeros(G, hkv, rows, dv, device=q.device)
    # Chunks per block: a memory bound (scores, gathered K and V), no effect on any chunk's bits.
    per_block = max(1, _FLOATS_PER_BLOCK // (G * hkv * chunk * max(rows, q.shape[2] + dv)))
    for lo in range(0, n_chunks, per_block):
        hi = min(lo + per_block, n_chunks)
        m_c, l_c, o_c = _chunk_stats(
            qg, qpos, k_buffer, v_buffer, slots[:, lo * chunk : hi * chunk], lo * chunk, chunk, scaling, window
        )
        for c in range(hi - lo):  # fold in position order
            m_new = torch.maximum(m, m_c[:, :, c])
            ref = _finite(m_new)
            alpha, beta = torch.exp(m - ref), torch.exp(m_c[:, :, c] - ref)
            l_sum = l_sum * alpha + l_c[:, :, c] * beta
            acc = acc * alpha + o_c[:, :, c] * beta
            m = m_new
    out = torch.where(l_sum > 0, acc / l_sum, 0.0)[:, :, : group * Q]  # padding rows: 0, dropped below
    out = out.view(G, hkv, group, Q, dv).permute(0, 3, 1, 2, 4).reshape(G, Q, H, dv)
    return out[layout.rows, layout.cols].to(q.dtype)


# float32 values per block of chunks (8 MiB): bounds a long prefill's memory, and a block that stays
# in cache is faster (decoding 64 requests of 250 tokens: 5.8 ms a layer, 19.7 ms with 64 MiB blocks).
_FLOATS_PER_BLOCK = 1 << 21


def _query_matrices(q: torch.Tensor, layout: KeyLayout, hkv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``[G, Hkv, rows, D]``: a group's queries of one KV head (head-major, then query) as one
    matrix of at least :data:`MIN_ROWS` rows, and ``[G, rows]`` each row's position (-1: padding)."""
    G, Q = layout.qpos.shape
    H, D = q.shape[1], q.shape[2]
    group = H // hkv
    qg = q.new_zeros(G, Q, H, D)
    qg[layout.rows, layout.cols] = q
    qg = qg.view(G, Q, hkv, group, D).permute(0, 2, 3, 1, 4).reshape(G, hkv, group * Q, D).float()
    qpos = layout.qpos[:, None, :].expand(G, group, Q).reshape(G, group * Q)
    pad = MIN_ROWS - group * Q
    if pad > 0:
        qg = torch.cat([qg, qg.new_zeros(G, hkv, pad, D)], 2)
        qpos = torch.cat([qpos, qpos.new_full((G, pad), -1)], 1)
    return qg, qpos


def _chunk_stats(
    qg: torch.Tensor,
    qpos: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    slots: torch.Tensor,
    first: int,
    chunk: int,
    scaling: float,
    window: int | None,
):
    """Each chunk's softmax statistics alone, for the chunks of ``slots`` (``[G, n * chunk]``, key
    positions from ``first``): ``m_c``, ``l_c`` ``[G, Hkv, n, rows, 1]`` and ``o_c`` ``[.., Dv]``."""
    G, hkv, D, dv = qg.shape[0], qg.shape[1], qg.shape[3], v_buffer.shape[2]
    n = slots.shape[1] // chunk
    # Keys as [D, C] and values as [C, Dv] matrices, each contiguous: with a transposed K, MKL's
    # bmm sums differently again.
    k = gather_rows(k_buffer, slots).view(G, n, chunk, hkv, D).permute(0, 3, 1, 4, 2).float().contiguous()
    v = gather_rows(v_buffer, slots).view(G, n, chunk, hkv, dv).permute(0, 3, 1, 2, 4).float().contiguous()
    t = first + torch.arange(n * chunk, device=qg.device).view(n, 1, chunk)
    hidden = t[None] > qpos[:, None, :, None]  # [G, n, rows, C]
    if window is not None:
        hidden |= t[None] < qpos[:, None, :, None] - window
    s = torch.matmul(qg[:, :, None], k).mul_(scaling).masked_fill_(hidden[:, None], float("-inf"))
    m_c = s.amax(-1, keepdim=True)
    p = torch.exp(s - _finite(m_c))
    return m_c, p.sum(-1, keepdim=True), torch.matmul(p, v)


def _finite(m: torch.Tensor) -> torch.Tensor:
    """A max over nothing visible yet (-inf) as 0: its weights stay exact zeros instead of NaN."""
    return torch.where(m == float("-inf"), 0.0, m)
