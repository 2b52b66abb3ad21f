"""EAGLE multi-step draft decoding for `echo_torch` (one backend per draft step).

sglang's draft decode runs ``bs * topk`` rows: lane k of request b (row ``b * topk + k``) sees the
request's prefix followed by its own draft slots. Branch k's slots live at
``seq_len + k * num_steps + t`` of the request's ``req_to_token`` row (the layout
``assign_draft_cache_locs_contiguous`` allocates and ``generate_draft_decode_kv_indices``,
sglang/kernels/ops/speculative/cache_locs.py, reads at page size 1).

So a request's row already holds every key its lanes need, in one list: the prefix, then each
lane's slots. :func:`draft_lane_metadata` lays the ``topk`` lanes of a request out as ``topk``
queries over that one list, each masked to the prefix and its own slots. The prefix's keys are
gathered once per request, not once per lane as sglang's in-tree CPU draft backend
(``IntelAMXMultiStepDraftBackend``) lays them out: at 8 requests, 4 lanes and a 300-token prefix
a layer's draft attention takes 0.9 ms instead of 2.8 on the 2-core host
(``benchmarks/draft_attention.py``).

The batch-invariant mode keeps one row per lane (:func:`build_draft_decode_metadata`): its kernel
is causal over each row's own key list, which is what decoding that lane alone would see.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Optional

import torch

from sglang_echo.platform.attention.backend import EchoTorchAttnBackend

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner


@dataclass(frozen=True)
class DraftDecodeMetadata:
    """One draft step's attention as a paged-attention problem: request ``b`` brings ``q_lens[b]``
    queries over the first ``kv_lens[b]`` slots of ``req_to_token[req_pool_indices[b]]``.

    ``visible`` (``[bs, max_q, max_kv]``) says which of them each query sees; None means causal
    (one query per row, seeing its whole row). ``key_pos`` and ``q_pos`` are the token positions
    of the key columns and queries, for a sliding window (None where ``visible`` is None: the
    causal mask places them itself)."""

    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor
    q_lens: torch.Tensor  # int64 [bs]
    kv_lens: torch.Tensor  # int64 [bs]
    visible: Optional[torch.Tensor] = None
    key_pos: Optional[torch.Tensor] = None  # [bs, max_kv]
    q_pos: Optional[torch.Tensor] = None  # [bs, max_q]

    def window_mask(self, window: Optional[int]) -> Optional[torch.Tensor]:
        """``visible`` restricted to keys no more than ``window`` positions behind the query."""
        if window is None or self.visible is None:
            return self.visible
        return self.visible & (self.key_pos[:, None, :] >= (self.q_pos - window)[:, :, None])

    def first_lanes(self, lanes: int, topk: int) -> DraftDecodeMetadata:
        """The step restricted to the first ``lanes`` of each request's ``topk`` lanes: query
        ``b * lanes + k`` is lane k of request b."""
        if self.visible is not None:  # the lanes as queries over the request's row
            return replace(
                self,
                q_lens=torch.full_like(self.q_lens, lanes),
                visible=self.visible[:, :lanes],
                q_pos=self.q_pos[:, :lanes],
            )

        def keep(t: torch.Tensor) -> torch.Tensor:  # one row per lane
            return t.view(-1, topk)[:, :lanes].reshape(-1)

        return replace(
            self, req_pool_indices=keep(self.req_pool_indices), q_lens=keep(self.q_lens), kv_lens=keep(self.kv_lens)
        )


def draft_lane_metadata(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    step: int,
) -> DraftDecodeMetadata:
    """Draft step ``step`` (0-based): lane k of request b sees the request's ``seq_len`` prefix and
    its own slots ``seq_len + k * num_steps + [0, step]``; every request's row is read once."""
    seq = seq_lens.to(torch.int64)
    width = int(seq.max()) + topk * num_steps
    col = torch.arange(width, device=seq.device)
    draft = col[None, :] - seq[:, None]  # [bs, width]: index among the request's draft slots, < 0 in the prefix
    lane_start = torch.arange(topk, device=seq.device)[None, :, None] * num_steps
    rel = draft[:, None, :] - lane_start  # [bs, topk, width]: step of the slot within lane k
    visible = (draft[:, None, :] < 0) | ((rel >= 0) & (rel <= step))
    key_pos = torch.where(draft < 0, col[None, :], seq[:, None] + draft.clamp(min=0) % num_steps)
    return DraftDecodeMetadata(
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        q_lens=torch.full_like(seq, topk),
        kv_lens=seq + topk * num_steps,
        visible=visible,
        key_pos=key_pos,
        q_pos=(seq + step)[:, None].expand(-1, topk),
    )


def build_draft_decode_metadata(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
) -> torch.Tensor:
    """One row per lane: row (b * topk + k) = req_to_token[req_b, :seq_len_b] ++ branch k's
    num_steps draft slots (the batch-invariant mode's layout)."""
    bs = seq_lens.numel()
    seq = seq_lens.to(torch.int64)
    width = int(seq.max()) + num_steps if bs else num_steps
    rows = req_to_token[req_pool_indices.to(torch.int64)]  # [bs, pool_len]
    col = torch.arange(width, device=seq.device)
    branch = torch.arange(topk, device=seq.device)
    # Source column in the request's row for (b, k, c): prefix columns map to themselves,
    # column seq_len + t maps to seq_len + k * num_steps + t.
    src = torch.where(
        col[None, None, :] < seq[:, None, None],
        col[None, None, :].expand(bs, topk, width),
        col[None, None, :] + branch[None, :, None] * num_steps,
    ).clamp(max=rows.shape[1] - 1)
    out = rows[:, None, :].expand(bs, topk, rows.shape[1]).gather(2, src)
    return out.reshape(bs * topk, width)


def lane_rows_metadata(table: torch.Tensor, seq_lens: torch.Tensor, topk: int, step: int) -> DraftDecodeMetadata:
    """Draft step ``step`` with one causal row per lane of ``table``
    (:func:`build_draft_decode_metadata`, built once for every step)."""
    lens = seq_lens.to(torch.int64).repeat_interleave(topk) + step + 1
    rows = torch.arange(table.shape[0], dtype=torch.int64, device=table.device)
    return DraftDecodeMetadata(table, rows, torch.ones_like(lens), lens)


class EchoTorchMultiStepDraftBackend:
    """sglang's multi-step draft backend for `echo_torch`: one :class:`EchoTorchAttnBackend` per
    draft step, each with its step's :class:`DraftDecodeMetadata`.

    A draft step may run fewer than ``topk`` lanes (:meth:`select_lanes`), so that a narrow
    frontier costs its own lanes and not ``topk`` padded ones."""

    def __init__(self, model_runner: ModelRunner, topk: int, speculative_num_steps: int):
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.device = model_runner.device
        self.attn_backends: list[EchoTorchAttnBackend] = [
            EchoTorchAttnBackend(model_runner) for _ in range(speculative_num_steps - 1)
        ]
        self._metadata: list[DraftDecodeMetadata] = []  # every lane's, per step
        self._lanes_run: list[int] = []  # lanes each step ran (topk unless selected)
        self._batch: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # (req_pool_indices, seq_lens)

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        req_to_token = self.attn_backends[0].req_to_token_pool.req_to_token
        seq_lens, req_pool_indices = forward_batch.seq_lens, forward_batch.req_pool_indices
        steps = self.speculative_num_steps
        table = None  # the batch-invariant mode's rows, one per lane, shared by every step
        if self.attn_backends[0].deterministic:
            table = build_draft_decode_metadata(req_to_token, req_pool_indices, seq_lens, self.topk, steps)
        self._metadata = [
            draft_lane_metadata(req_to_token, req_pool_indices, seq_lens, self.topk, steps, step)
            if table is None
            else lane_rows_metadata(table, seq_lens, self.topk, step)
            for step in range(len(self.attn_backends))
        ]
        for backend, md in zip(self.attn_backends, self._metadata):
            backend.extend_metadata = None
            backend.draft_decode_metadata = md
            backend.forget_layouts()
        self._lanes_run = [self.topk] * len(self.attn_backends)
        self._batch = (req_pool_indices, seq_lens)

    def select_lanes(self, step: int, lanes: int) -> None:
        """Draft step ``step`` runs the first ``lanes`` lanes of each request (row ``b * lanes + k``
        of its forward is lane k of request b), the caller's ``out_cache_loc`` their slots.

        What a lane sees is unchanged: a lane an earlier step did not run gets lane 0's KV at that
        step (copied here, before the lane reads it), which is what the padded layout, feeding the
        lanes beyond the frontier duplicates of lane 0, writes there. One EAGLE draft layer's keys
        are a function of the lane's own token, hidden state and position only."""
        if not 1 <= lanes <= self.topk:
            raise ValueError(f"a draft step runs 1 to topk={self.topk} lanes, not {lanes}")
        for earlier in range(step):
            if self._lanes_run[earlier] < lanes:
                self._copy_lane0(earlier, self._lanes_run[earlier], lanes)
                self._lanes_run[earlier] = lanes
        self._lanes_run[step] = lanes
        backend = self.attn_backends[step]
        backend.draft_decode_metadata = self._metadata[step].first_lanes(lanes, self.topk)
        backend.forget_layouts()

    def _copy_lane0(self, step: int, first: int, end: int) -> None:
        """Lane 0's draft KV at ``step`` into lanes ``[first, end)`` (every layer of the draft pool)."""
        req, seq = self._batch
        req_to_token = self.attn_backends[0].req_to_token_pool.req_to_token
        # Lane k's slot at step t: column seq_len + k * num_steps + t of the request's row.
        lanes = torch.arange(end, device=seq.device) * self.speculative_num_steps + step
        slots = req_to_token[req.to(torch.int64)[:, None], seq.to(torch.int64)[:, None] + lanes].to(torch.int64)
        src = slots[:, :1].expand(-1, end - first).reshape(-1)
        dst = slots[:, first:end].reshape(-1)
        pool = self.attn_backends[0].token_to_kv_pool
        for layer_id in range(pool.start_layer, pool.start_layer + pool.layer_num):
            for buf in (pool.get_key_buffer(layer_id), pool.get_value_buffer(layer_id)):
                buf[dst] = buf[src]
