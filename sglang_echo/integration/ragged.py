"""Ragged verify: one target pass over the sum_i K_i real tree nodes, not B*W padded slots.

The padded-dense layout (:mod:`.padded`) gives every request ``W`` verify slots, so the target
pays for ``B*W`` tokens whatever the ECHO scheduler allocated: the budget it saved (Eq. 4,
``sum_i K_i <= K_max``) only becomes time when the forward skips the padding. Ragged mode keeps
sglang's dense layout at every seam that indexes it (``retrieve_index``, acceptance, KV commit,
draft extend) and compacts only the target forward, as DSPARK does for its chains:

1. the worker marks its verify input with ``echo_verify_lens = K`` ([B] int, real nodes are
   slots ``[0, K_b)`` of request ``b``'s ``W`` slots, as :func:`.padded.to_sglang_dense` lays
   them out);
2. :func:`ragged_verify_forward` (an AROUND hook on ``ModelRunner.forward``, registered by the
   plugin) sees the mark on a TARGET_VERIFY batch, gathers the ``sum K`` real rows of
   ``input_ids`` / ``positions`` and their KV write ids (the batch's ``KVLocPlan`` takes
   packed rows: ``bind(cols=rows)``) into a shallow copy of the batch, runs the
   model once on them, and scatters the per-token outputs (logits, captured hidden states) back
   to ``B*W`` rows;
3. the attention backend, seeing the mark, gives request ``b`` ``K_b`` queries and
   ``prefix_b + K_b`` keys (the first ``K_b`` slots hold exactly the real nodes' KV).

Padding slots are never computed: no real node sees them (the tree mask), no retrieve link
reaches them, and their KV slots are freed with the other unaccepted ones. Their logits rows
are zero, i.e. uniform, and never read. Only backends that declare
``supports_ragged_verify = True`` (the CPU platform's ``echo_torch``) get marked batches; see
:func:`resolve_verify_mode`.
"""

from __future__ import annotations

import copy
import logging
from enum import StrEnum
from typing import Any, Callable

import torch

from sglang_echo.platform.ops.ranges import ragged_ranges

log = logging.getLogger(__name__)

RUNNER_FORWARD = "sglang.srt.model_executor.model_runner.ModelRunner.forward"  # hooked (AROUND)
MARK = "echo_verify_lens"  # attribute on the verify input (spec_info) that requests ragged verify


class VerifyMode(StrEnum):
    """Which tokens the target's verify forward computes: every request's ``W`` slots
    (``padded``), its real tree nodes only (``ragged``), or ragged where the backend can (``auto``)."""

    AUTO = "auto"
    RAGGED = "ragged"
    PADDED = "padded"


VERIFY_MODES = tuple(VerifyMode)
# Per-token inputs of a TARGET_VERIFY ForwardBatch (others are per request or scalars; the write
# locations come from the batch's KVLocPlan, which supports packed ragged rows itself).
_TOKEN_FIELDS = ("input_ids", "positions")
# Per-token fields that would need compacting too if set; ragged verify refuses the batch instead.
_UNSUPPORTED_FIELDS = ("kv_loc_cols", "input_embeds", "mrope_positions", "origin_out_cache_loc",
                       "global_num_tokens_cpu")
# Per-token outputs of the verify forward that sglang indexes with dense flat ids.
_OUTPUT_FIELDS = ("next_token_logits", "hidden_states", "hidden_states_before_norm")


def resolve_verify_mode(requested: str, attn_backend: Any) -> str:
    """``auto`` -> ragged where the target's attention backend supports it, else padded."""
    supported = bool(getattr(attn_backend, "supports_ragged_verify", False))
    if requested == "auto":
        return "ragged" if supported else "padded"
    if requested == "ragged" and not supported:
        raise ValueError(
            f"ECHO verify=ragged needs an attention backend with ragged tree verify; "
            f"{type(attn_backend).__name__} has none (use verify=padded or auto)"
        )
    return requested


def target_tokens(mode: str, sizes: torch.Tensor, width: int) -> int:
    """Tokens the target verify forward computes in ``mode``: what verify time depends on."""
    return int(sizes.sum()) if mode == "ragged" else int(sizes.numel()) * width


def ragged_rows(lens: torch.Tensor, width: int) -> torch.Tensor:
    """Flat dense ids ``b*W + j`` of the real slots ``j < lens[b]``, request-major."""
    lens = lens.to(torch.int64)
    rows, cols = ragged_ranges(torch.zeros_like(lens), lens)
    return rows * width + cols


def compact_verify_batch(forward_batch: Any, lens: torch.Tensor, translator: Any) -> tuple[Any, torch.Tensor, int]:
    """A shallow copy of a TARGET_VERIFY batch holding only the real tree nodes.

    ``translator`` is the runner's ``kv_index_translator`` (the batch's KVLocPlan maps the kept
    rows to their write ids in its pool). Returns ``(compact_batch, rows, dense_tokens)``:
    ``rows`` are the dense flat ids of the kept tokens, ``dense_tokens = B*W``.
    """
    for name in _UNSUPPORTED_FIELDS:
        if getattr(forward_batch, name, None) is not None:
            raise NotImplementedError(f"ECHO ragged verify: ForwardBatch.{name} is set; use verify=padded")
    bs = forward_batch.batch_size
    dense_tokens = forward_batch.input_ids.shape[0]
    width = dense_tokens // bs
    if width * bs != dense_tokens or lens.shape[0] != bs or int(lens.max()) > width or int(lens.min()) < 1:
        raise ValueError(f"ECHO ragged verify: {dense_tokens} tokens for {bs} requests, lens {lens.tolist()}")
    rows = ragged_rows(lens.to(forward_batch.input_ids.device), width)
    compact = copy.copy(forward_batch)
    for name in _TOKEN_FIELDS:
        setattr(compact, name, getattr(forward_batch, name)[rows])
    if forward_batch.kv_loc_plan is not None:
        forward_batch.kv_loc_plan.bind(compact, translator, cols=rows)  # "a ragged verify's packed rows"
    else:
        compact.out_cache_loc = forward_batch.out_cache_loc[rows]
    n = int(rows.shape[0])  # sglang's "real tokens" counts follow the input (MoE masking, padding)
    compact.global_num_token_non_padded_cpu = n
    for name in ("global_num_token_non_padded", "num_token_non_padded"):
        if getattr(forward_batch, name, None) is not None:
            setattr(compact, name, torch.full_like(getattr(forward_batch, name), n))
    return compact, rows, dense_tokens


def expand_outputs(logits_output: Any, rows: torch.Tensor, dense_tokens: int) -> None:
    """Scatter the compact forward's per-token outputs back to the dense ``B*W`` rows (in place)."""
    for name in _OUTPUT_FIELDS:
        value = getattr(logits_output, name, None)
        if isinstance(value, torch.Tensor) and value.shape[0] == rows.shape[0]:
            dense = value.new_zeros((dense_tokens, *value.shape[1:]))
            dense[rows] = value
            setattr(logits_output, name, dense)


def ragged_verify_forward(original: Callable[..., Any], runner: Any, forward_batch: Any, *args, **kwargs):
    """AROUND ``ModelRunner.forward``: compact marked verify batches (see the module docstring)."""
    lens = getattr(forward_batch.spec_info, MARK, None) if forward_batch.forward_mode.is_target_verify() else None
    if lens is None:
        return original(runner, forward_batch, *args, **kwargs)
    compact, rows, dense_tokens = compact_verify_batch(forward_batch, lens, runner.kv_index_translator)
    out = original(runner, compact, *args, **kwargs)
    expand_outputs(out.logits_output, rows, dense_tokens)
    return out
