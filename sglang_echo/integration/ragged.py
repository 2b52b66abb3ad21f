"""Ragged verify: one target pass over the sum_i K_i real tree nodes, not B*W padded slots.

The padded-dense layout (:mod:`.padded`) gives every request ``W`` verify slots, so the target
pays for ``B*W`` tokens whatever the ECHO scheduler allocated: the budget it saved (Eq. 4,
``sum_i K_i <= K_max``) only becomes time when the forward skips the padding. Ragged mode keeps
sglang's dense layout at every seam that indexes it (``retrieve_index``, acceptance, KV commit,
draft extend) and compacts only the target forward, as DSPARK does for its chains:

1. the worker marks its verify input with ``echo_verify_lens = K`` ([B] int, real nodes are
   slots ``[0, K_b)`` of request ``b``'s ``W`` slots, as :func:`.padded.to_sglang_dense` lays
   them out) and ``echo_verify_tokens = N = sum K`` (a host int: no device sync);
2. :func:`ragged_verify_forward` (an AROUND hook on ``ModelRunner.forward``, registered by the
   plugin) sees the mark on a TARGET_VERIFY batch and builds a shallow copy of the batch whose
   per-token inputs (``input_ids``, ``positions``, the KV write ids through the batch's
   ``KVLocPlan``: ``bind(cols=lanes)``) hold the ``N`` real nodes, request-major, then ``T - N``
   padding lanes (token 0, position 0, writes to the sink slot 0). ``T = N`` for an eager forward;
   under sglang's compact ragged-verify CUDA graphs ``T`` is the smallest captured token tier
   ``>= N`` (:func:`graph_tier`) and the copy's verify input carries sglang's
   ``RaggedVerifyLayout(K, T)``, so ``ModelRunner._forward_raw`` replays that tier's graph by
   itself. The model runs once; its per-token outputs (logits, captured hidden states) are
   scattered back to ``B*W`` rows;
3. the attention backend, seeing the mark, gives request ``b`` ``K_b`` queries over
   ``prefix_b + K_b`` keys (the first ``K_b`` slots hold exactly the real nodes' KV) and the
   padding lanes nothing to see.

Padding slots are never computed: no real node sees them (the tree mask), no retrieve link
reaches them, and their KV slots are freed with the other unaccepted ones. Their logits rows are
zero, i.e. uniform, and never read. Only backends that declare ``supports_ragged_verify = True``
(``echo_torch`` on the CPU platform; ``echo_tree_triton``, eagerly and, with
``supports_ragged_verify_graph``, under graphs) get marked batches; see :func:`resolve_verify_mode`.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Callable, Optional

import torch

from sglang_echo.core.dense import RAGGED_MARK
from sglang_echo.kernels.registration import BACKEND_NAME as TREE_BACKEND
from sglang_echo.kernels.tree_attention.ragged_tier import lane_map

log = logging.getLogger(__name__)

RUNNER_FORWARD = "sglang.srt.model_executor.model_runner.ModelRunner.forward"  # hooked (AROUND)
MARK = RAGGED_MARK  # on the verify input (spec_info): see sglang_echo.core.dense.RAGGED_MARK
TOTAL = "echo_verify_tokens"  # its host-side sum (optional: without it the hook reads the sum)
PADDED_COST = "the target then computes B x W tokens per step"


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
_UNSUPPORTED_FIELDS = (
    "kv_loc_cols",
    "input_embeds",
    "mrope_positions",
    "origin_out_cache_loc",
    "global_num_tokens_cpu",
)
# Per-token outputs of the verify forward that sglang indexes with dense flat ids.
_OUTPUT_FIELDS = ("next_token_logits", "hidden_states", "hidden_states_before_norm")


# -- which mode a server runs ---------------------------------------------------------------------
def backend_name(attn_backend: Any) -> str:
    """The ``--attention-backend`` name sglang stamped on a built backend, else its class name."""
    if isinstance(attn_backend, type):
        return attn_backend.__name__
    return getattr(attn_backend, "decode_attention_backend_str", None) or type(attn_backend).__name__


def ragged_blocker(attn_backend: Any, graph_runner: Any = None) -> Optional[str]:
    """Why the target cannot verify ragged trees (None: it can). ``graph_runner`` is the target's
    decode CUDA-graph runner (None: its verify runs eagerly)."""
    name = backend_name(attn_backend)
    if not getattr(attn_backend, "supports_ragged_verify", False):
        return (
            f"attention backend '{name}' cannot verify ragged trees (per-request K_i with a tree mask); "
            f"use --attention-backend {TREE_BACKEND}"
        )
    if graph_runner is None:
        return None
    if not getattr(attn_backend, "supports_ragged_verify_graph", False):
        return (
            f"attention backend '{name}' verifies ragged trees only without CUDA graphs; add "
            f"--disable-cuda-graph or use --attention-backend {TREE_BACKEND}"
        )
    if not getattr(graph_runner, "ragged_verify_mode", False):
        from sglang.srt.environ import envs

        mode = envs.SGLANG_RAGGED_VERIFY_MODE.get()
        if mode != "compact":
            return f"ragged verify with CUDA graphs needs SGLANG_RAGGED_VERIFY_MODE=compact (got '{mode}')"
        return (
            "the target's CUDA graphs were captured W wide (ECHO's supports_ragged_verify() was False "
            "when they were captured)"
        )
    return None


def resolve_verify_mode(requested: str, attn_backend: Any, graph_runner: Any = None) -> str:
    """``auto`` -> ragged where the target can verify ragged trees (:func:`ragged_blocker`), else
    padded (logged once, with the reason); ``ragged`` where it cannot stops the server."""
    if requested == VerifyMode.PADDED:
        return VerifyMode.PADDED.value
    blocker = ragged_blocker(attn_backend, graph_runner)
    if blocker is None:
        return VerifyMode.RAGGED.value
    if requested == VerifyMode.RAGGED:
        raise ValueError(f"ECHO verify=ragged: {blocker}, or set verify=padded ({PADDED_COST})")
    log.info("ECHO verify=auto: padded, as %s (%s)", blocker, PADDED_COST)
    return VerifyMode.PADDED.value


def wants_ragged_graphs(verify: str, drafter: str, device: Optional[str], decode_backend: Optional[str]) -> bool:
    """Whether ECHO asks sglang for compact ragged-verify graphs (``supports_ragged_verify()``).

    Only where they can be replayed: a verify mode that may be ragged, the EAGLE-plumbed worker
    (the n-gram worker verifies through NGRAM's uniform graphs), a CUDA target decoding with
    ``echo_tree_triton``. sglang adds ``SGLANG_RAGGED_VERIFY_MODE=compact``; the mode is
    process-wide, so a True anywhere else would send every verify to eager (no layout, no graph)."""
    return verify != VerifyMode.PADDED and drafter != "ngram" and device == "cuda" and decode_backend == TREE_BACKEND


# -- one step -------------------------------------------------------------------------------------
def graph_tier(n: int, bs: int, graph_runner: Any) -> Optional[int]:
    """The token tier sglang's decode graph runner replays ``n`` verify tokens of ``bs`` requests
    at: the smallest captured tier ``>= n`` (``round_up_grid``) whose request slots hold ``bs``.
    None where the forward runs eagerly: no runner, a runner with uniform (``W``-wide) graphs, a
    backend without ragged graphs, ``n`` past the largest tier or ``bs`` past the slots (more
    requests than ``max_bs``)."""
    if graph_runner is None or not getattr(graph_runner, "ragged_verify_mode", False):
        return None
    if not getattr(graph_runner.attn_backend, "supports_ragged_verify_graph", False):
        return None
    tiers = graph_runner.capture_num_tokens
    if not tiers or n > tiers[-1]:
        return None
    from sglang.srt.speculative.ragged_verify import round_up_grid

    tier = round_up_grid(n, tiers)
    return tier if bs <= graph_runner._ragged_capture_slots(tier) else None


def target_tokens(
    mode: str, sizes: torch.Tensor, width: int, graph_runner: Any = None, total: Optional[int] = None
) -> int:
    """Tokens the target verify forward computes in ``mode``: what verify time depends on.
    Ragged: ``N = sum K_i`` (``total`` when the caller knows it), or its graph tier."""
    if mode != VerifyMode.RAGGED:
        return int(sizes.numel()) * width
    n = int(sizes.sum()) if total is None else total
    return graph_tier(n, int(sizes.numel()), graph_runner) or n


def mark_verify(verify_input: Any, sizes: torch.Tensor, total: int, width: int, always: bool) -> None:
    """Ask for a ragged forward: ``K = sizes``, ``N = total`` (host). Without ``always`` a step
    whose every tree fills its ``width`` slots (dense layout == ragged one) stays unmarked; under
    compact graphs every verify must be marked (an unmarked one runs eagerly)."""
    if always or total < sizes.numel() * width:
        setattr(verify_input, MARK, sizes)
        setattr(verify_input, TOTAL, total)


def ragged_rows(lens: torch.Tensor, width: int, total: Optional[int] = None) -> torch.Tensor:
    """Flat dense ids ``b*W + j`` of the real slots ``j < lens[b]``, request-major."""
    return lane_map(lens, width, int(lens.sum()) if total is None else total)


@dataclass
class CompactVerify:
    """A TARGET_VERIFY batch's compact copy and how to map its outputs back."""

    batch: Any  # the shallow copy: T lanes per token field
    rows: torch.Tensor  # [N] dense flat id of each real lane (lanes 0..N-1)
    dense_tokens: int  # B*W
    lanes: int  # T


def compact_verify_batch(
    forward_batch: Any, lens: torch.Tensor, translator: Any, *, total: Optional[int] = None, tier: Optional[int] = None
) -> CompactVerify:
    """The compact copy of a TARGET_VERIFY batch: its real tree nodes, then padding to ``tier``.

    ``translator`` is the runner's ``kv_index_translator`` (the batch's KVLocPlan maps each lane
    to its write id in its pool, ``-1`` to the sink). With a ``tier`` the copy's verify input
    (a shallow copy too) carries sglang's ``RaggedVerifyLayout(K, tier)``. Value checks on ``lens``
    run only where they cost no device sync (CPU tensors)."""
    for name in _UNSUPPORTED_FIELDS:
        if getattr(forward_batch, name, None) is not None:
            raise NotImplementedError(f"ECHO ragged verify: ForwardBatch.{name} is set; use verify=padded")
    bs = forward_batch.batch_size
    dense_tokens = forward_batch.input_ids.shape[0]
    width = dense_tokens // bs
    if (
        width * bs != dense_tokens
        or lens.shape[0] != bs
        or (lens.device.type == "cpu" and (int(lens.max()) > width or int(lens.min()) < 1))
    ):
        raise ValueError(
            f"ECHO ragged verify: {dense_tokens} tokens for {bs} requests, lens {lens.tolist()} "
            f"(each request verifies 1..W nodes)"
        )
    n = int(lens.sum()) if total is None else total
    lanes_n = n if tier is None else tier
    if lanes_n < n:
        raise ValueError(f"ECHO ragged verify: {n} verify tokens do not fit tier {tier}")
    lanes = lane_map(lens.to(forward_batch.input_ids.device), width, lanes_n)
    real, take = lanes >= 0, lanes.clamp(min=0)
    compact = copy.copy(forward_batch)
    for name in _TOKEN_FIELDS:
        value = getattr(forward_batch, name)
        setattr(compact, name, torch.where(real, value[take], 0))  # padding: token 0 at position 0
    if forward_batch.kv_loc_plan is not None:
        forward_batch.kv_loc_plan.bind(compact, translator, cols=lanes)  # "a ragged verify's packed rows"
    else:
        compact.out_cache_loc = torch.where(real, forward_batch.out_cache_loc[take], 0)  # slot 0: the sink
    # sglang's "real tokens" counts follow the input (MoE masking, padding): every lane is computed.
    compact.global_num_token_non_padded_cpu = lanes_n
    for name in ("global_num_token_non_padded", "num_token_non_padded"):
        if getattr(forward_batch, name, None) is not None:
            setattr(compact, name, torch.full_like(getattr(forward_batch, name), lanes_n))
    compact.spec_info = spec = copy.copy(forward_batch.spec_info)
    spec.positions = compact.positions
    if tier is not None:
        from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

        spec.ragged_verify_layout = RaggedVerifyLayout.from_verify_lens_device(verify_lens=lens, graph_num_tokens=tier)
    return CompactVerify(compact, lanes[:n], dense_tokens, lanes_n)


def expand_outputs(logits_output: Any, rows: torch.Tensor, dense_tokens: int, lanes: Optional[int] = None) -> None:
    """Scatter a compact forward's per-token outputs (``lanes`` rows, the real ones first) back to
    the dense ``B*W`` rows, in place; padding lanes and slots are dropped (zero rows)."""
    lanes = rows.shape[0] if lanes is None else lanes
    for name in _OUTPUT_FIELDS:
        value = getattr(logits_output, name, None)
        if isinstance(value, torch.Tensor) and value.shape[0] == lanes:
            dense = value.new_zeros((dense_tokens, *value.shape[1:]))
            dense[rows] = value[: rows.shape[0]]
            setattr(logits_output, name, dense)


def ragged_verify_forward(original: Callable[..., Any], runner: Any, forward_batch: Any, *args, **kwargs):
    """AROUND ``ModelRunner.forward``: compact marked verify batches (see the module docstring)."""
    spec = forward_batch.spec_info
    lens = getattr(spec, MARK, None) if forward_batch.forward_mode.is_target_verify() else None
    if lens is None:
        return original(runner, forward_batch, *args, **kwargs)
    total = getattr(spec, TOTAL, None)
    n = int(lens.sum()) if total is None else total
    tier = graph_tier(n, forward_batch.batch_size, getattr(runner, "decode_cuda_graph_runner", None))
    c = compact_verify_batch(forward_batch, lens, runner.kv_index_translator, total=n, tier=tier)
    out = original(runner, c.batch, *args, **kwargs)
    expand_outputs(out.logits_output, c.rows, c.dense_tokens, c.lanes)
    return out
