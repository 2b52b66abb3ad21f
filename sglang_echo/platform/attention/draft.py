"""EAGLE multi-step draft decoding for `echo_torch` (one backend per draft step).

Mirrors sglang's in-tree `IntelAMXMultiStepDraftBackend` (sglang/srt/layers/attention/
intel_amx_backend.py): every (request, top-k branch) pair becomes its own decode row whose
KV is the request's prefix followed by that branch's draft slots.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sglang_echo.platform.attention.backend import EchoTorchAttnBackend

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner


def build_draft_decode_metadata(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
) -> torch.Tensor:
    """Row (b * topk + k) = req_to_token[req_b, :seq_len_b] ++ branch k's num_steps draft slots.

    Branch k's slots live at `seq_len + k * num_steps + t` of the request's row: the layout
    `assign_draft_cache_locs_contiguous` allocates and `generate_draft_decode_kv_indices`
    (sglang/kernels/ops/speculative/cache_locs.py, page_size == 1) reads.
    """
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


class EchoTorchMultiStepDraftBackend:
    def __init__(self, model_runner: ModelRunner, topk: int, speculative_num_steps: int):
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.device = model_runner.device
        self.attn_backends: list[EchoTorchAttnBackend] = [
            EchoTorchAttnBackend(model_runner) for _ in range(speculative_num_steps - 1)
        ]

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        seq_lens = forward_batch.seq_lens
        req_to_token = self.attn_backends[0].req_to_token_pool.req_to_token
        table = build_draft_decode_metadata(
            req_to_token,
            forward_batch.req_pool_indices,
            seq_lens,
            self.topk,
            self.speculative_num_steps,
        )
        rows = torch.arange(table.shape[0], dtype=torch.int64, device=self.device)
        for step, backend in enumerate(self.attn_backends):
            # At draft step `step` each branch sees its prefix + (step + 1) draft tokens.
            lens = seq_lens.to(torch.int64).repeat_interleave(self.topk) + step + 1
            backend.extend_metadata = None
            backend.draft_decode_metadata = (table, lens, rows)
            backend.layout = None
