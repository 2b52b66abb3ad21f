"""``drafter: dflash``: the DFlash drafter inside sglang, its context in sglang's draft KV pool.

DFlash (z-lab layout, :mod:`sglang_echo.drafters.dflash_head`) drafts a whole block in one forward:
the block ``[root, MASK x (bs - 1)]`` attends to a *context* of every committed position ``t``, whose
key/value in each draft layer is a projection of the target's features of token ``x_t``. That
context is exactly what a KV cache holds, so it lives in the draft KV pool sglang already sizes for
the draft model (one slot per target slot, shared ``req_to_token``):

* **Capture.** The target captures DFlash's layers through EAGLE-3's aux-hidden plumbing
  (:func:`resolve_capture_layers` sets them from the head's ``target_layer_ids``).
* **Writes.** In place of EAGLE's draft extends (:class:`DFlashDrafting`, the step strategy of
  :mod:`.drafting`): each prefill chunk writes the context K/V of its extend tokens, at the slots the
  target used; each decode step writes the root and accepted drafts, whose features and slots
  ``_finalize_accept_tree_path`` moved to the front of every request's verify window. Both relay a
  zeroed draft input (DFlash reads only the bonus tokens). Radix-cached prefixes keep their context,
  chunked prefill and retraction need nothing special: the data is in the pool.
* **Step.** :class:`DFlashFrontierDrafter` reads each request's context through ``req_to_token``,
  runs the block forward (:func:`sglang_echo.drafters.dflash.block_marginals`, the offline
  drafter's own code) and branches the per-position marginals into candidates for any core policy
  (:func:`~sglang_echo.drafters.dflash.marginal_candidates`); sglang verifies them as EAGLE's.

The math is the repo's :class:`~sglang_echo.drafters.dflash_head.DFlashHead` on the target's
embedding and LM head (loaded in place of sglang's LM head setup); sglang's ``DFlashDraftModel``
is still what loads (and checks) the checkpoint and sizes the pool. Its forward is never called,
and no draft CUDA graph is captured (the block forward is eager). No drafted token is ever written
to the pool.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from sglang_echo.core.policy import Frontier
from sglang_echo.core.tree import Candidates
from sglang_echo.drafters.dflash import block_marginals, marginal_candidates
from sglang_echo.drafters.dflash_head import ARCHITECTURE, DFlashConfig, DFlashHead
from sglang_echo.platform.attention.paged_sdpa import gather_rows

from .config import Drafter
from .drafting import StepDrafter

log = logging.getLogger(__name__)

RESOLVER = "sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state._resolve_eagle_aux_hidden_state"


def is_dflash_config(hf_config: Any) -> bool:
    return ARCHITECTURE in (getattr(hf_config, "architectures", None) or [])


def resolve_capture_layers(original: Callable[..., Any], **kwargs: Any) -> Any:
    """AROUND sglang's EAGLE aux-hidden resolution: under ECHO with a DFlash head, capture the
    head's ``target_layer_ids`` (DFlash and EAGLE-3 share the "output of layer i" convention that
    ``set_eagle3_layers_to_capture`` turns into "input of layer i + 1"). EAGLE-3 reads them from
    the draft's ``eagle_config``, which a DFlash checkpoint does not have."""
    result = original(**kwargs)
    config, spec = kwargs["config"], kwargs["spec_algorithm"]
    draft = getattr(config, "draft_model_config", None)
    if kwargs.get("is_draft_worker") or not spec.is_eagle3() or draft is None or not is_dflash_config(draft.hf_config):
        return result
    L = int(kwargs["model_config"].hf_text_config.num_hidden_layers)
    cfg = DFlashConfig.from_hf(draft.hf_config.to_dict(), num_target_layers=L)
    config.eagle_aux_hidden_state_layer_ids = list(cfg.target_layer_ids)
    log.info("ECHO DFlash drafter: target captures layers %s (DFlash target_layer_ids)", list(cfg.target_layer_ids))
    return result


def load_head(draft_path: str, target_model: Any, num_target_layers: int, device) -> DFlashHead:
    """The head of ``draft_path`` on the target's embedding and LM head (untied heads use theirs)."""
    embed = target_model.get_input_embeddings().weight
    lm_head = getattr(getattr(target_model, "lm_head", None), "weight", None)
    tied = lm_head is None or lm_head.data_ptr() == embed.data_ptr()
    head = DFlashHead.load(
        Path(draft_path),
        embed=embed.detach(),
        lm_head=None if tied else lm_head.detach(),
        num_target_layers=num_target_layers,
    )
    return head.to(device).eval()


class DFlashPoolContext:
    """DFlash's per-layer context K/V, kept in sglang's draft KV pool (module docstring)."""

    def __init__(self, head: DFlashHead, draft_runner: Any):
        self.head = head
        self.pool = draft_runner.token_to_kv_pool
        self.attn = [layer.self_attn.attn for layer in draft_runner.model.layers]
        if len(self.attn) != head.cfg.num_hidden_layers:
            raise ValueError(f"sglang loaded {len(self.attn)} DFlash layers, the head has {head.cfg.num_hidden_layers}")
        if self.pool.get_key_buffer(self.attn[0].layer_id).element_size() == 1:
            raise NotImplementedError("ECHO's DFlash drafter does not read an fp8 draft KV cache yet")

    @torch.no_grad()
    def write(self, features: Tensor, positions: Tensor, slots: Tensor) -> None:
        """Context of committed tokens: target features ``[N, n_ctx * H]`` at ``positions [N]``,
        written to pool ``slots [N]`` of every draft layer."""
        if features.shape[0] == 0:
            return
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc

        head = self.head
        ctx = head.context(features[None].to(head.fc.weight.dtype))
        loc = KVWriteLoc(slots, physical=True)
        for attn, (k, v) in zip(self.attn, head.context_kv(ctx, positions[None].long())):
            self.pool.set_kv_buffer(attn, loc, k[0].transpose(0, 1).contiguous(), v[0].transpose(0, 1).contiguous())

    def gather(self, slots: Tensor, valid: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Per layer ``(k, v)`` ``[B, kv_heads, L, D]`` of pool ``slots [B, L]``; entries that are not
        ``valid`` (past a request's length: other requests' slots, or never written) read as zeros,
        so masked-out garbage can never poison the attention (0 * inf)."""
        dtype, keep = self.head.fc.weight.dtype, valid[:, :, None, None]

        def read(buf: Tensor) -> Tensor:
            return torch.where(keep, gather_rows(buf, slots).to(dtype), 0).transpose(1, 2)

        return [
            (read(self.pool.get_key_buffer(a.layer_id)), read(self.pool.get_value_buffer(a.layer_id)))
            for a in self.attn
        ]


def extend_positions(prefix_lens: Any, extend_lens: Any, device) -> Tensor:
    """Absolute positions of a prefill batch's extend tokens: ``prefix_i + 0 .. extend_i - 1``, request
    after request."""
    prefix = torch.as_tensor(prefix_lens, dtype=torch.int64, device=device)
    lens = torch.as_tensor(extend_lens, dtype=torch.int64, device=device)
    first = torch.cumsum(lens, 0) - lens  # each request's first row
    rows = torch.arange(int(lens.sum()), device=device)
    return torch.repeat_interleave(prefix - first, lens) + rows


class DFlashFrontierDrafter:
    """The core's drafter protocol for one ECHO step of the DFlash drafter."""

    def __init__(self, worker: Any, batch: Any, roots: Tensor, context: DFlashPoolContext):
        self.w, self.batch, self.roots, self.context = worker, batch, roots, context
        self.logp: Tensor | None = None
        self.forwards = 0

    def propose(self, frontier: Frontier, k: int) -> Candidates:
        if frontier.depth == 0:
            self.logp = self._block()
        return marginal_candidates(self.logp, frontier, k, ready=self.lengths > 0)

    def adopt(self, parent: Tensor, tokens: Tensor, *, before: bool) -> None:
        """Nothing to keep: a depth's children come from its marginal whatever their parent."""

    def _block(self) -> Tensor:
        """One block forward over every request's context (positions ``0 .. seq_len - 1``)."""
        batch = self.batch
        self.lengths = batch.seq_lens.to(torch.int64)
        L = int(self.lengths.max()) if self.lengths.numel() else 0
        slots = self.w.req_to_token_pool.req_to_token[batch.req_pool_indices.long(), :L].long()
        valid = torch.arange(L, device=slots.device)[None, :] < self.lengths[:, None]
        self.forwards += 1
        return block_marginals(self.context.head, self.roots, self.lengths, self.context.gather(slots, valid))


def window_slots(dw: Any, batch: Any, kv_loc_plan: Any) -> Tensor:
    """The draft pool's slots of the tokens the target just wrote (its plan's, or the batch's)."""
    if kv_loc_plan is not None:
        return kv_loc_plan.write_ids(dw.draft_runner.kv_index_translator)
    return batch.out_cache_loc


class DFlashDrafting(StepDrafter):
    """DFlash's step: its context in the draft KV pool in place of EAGLE's draft layer (module
    docstring)."""

    kind = Drafter.DFLASH
    drafts_from_extend = False  # the block forward reads the context, not EAGLE's relayed children
    draft_graphs = False  # the block forward is eager; sglang's DFlashDraftModel forward never runs

    def __init__(self) -> None:
        self.context: DFlashPoolContext | None = None  # set with the draft pools (init_lm_head)

    def init_lm_head(self, dw: Any) -> None:
        """The DFlash head on the target's embedding and LM head (it drafts over the target's
        vocabulary), its context in the draft pool just allocated."""
        target = dw.target_worker.model_runner
        head = load_head(
            dw.server_args.speculative_draft_model_path, target.model, target.model_config.num_hidden_layers, dw.device
        )
        self.context = DFlashPoolContext(head, dw.draft_runner)
        log.info(
            "ECHO DFlash drafter: block_size %d, %d layers, target layers %s",
            head.cfg.block_size,
            head.cfg.num_hidden_layers,
            list(head.cfg.target_layer_ids),
        )

    def frontier(self, dw: Any, batch: Any, forward_batch: Any, roots: Tensor) -> DFlashFrontierDrafter:
        return DFlashFrontierDrafter(dw, batch, roots, self.context)

    def extend_for_prefill(self, dw, batch, target_hidden_states, next_token_ids, mm_input_embeds, kv_loc_plan):
        if not batch.forward_mode.is_idle():  # every extend token joins its request's context
            self.context.write(
                target_hidden_states,
                extend_positions(batch.prefix_lens, batch.extend_lens, dw.device),
                window_slots(dw, batch, kv_loc_plan),
            )
        return dw.placeholder_draft_input(next_token_ids)

    def extend_for_decode(self, dw, batch, batch_result, kv_loc_plan) -> None:
        if not batch.forward_mode.is_idle():
            # The root and accepted drafts (accept_lens of them), moved with their features to the
            # front of each request's verify window, at positions seq_lens .. (pre-verify lengths).
            bs, W = batch.seq_lens.shape[0], dw.speculative_num_draft_tokens
            take = torch.arange(W, device=dw.device)[None, :] < batch_result.accept_lens[:, None]
            pos = batch.seq_lens.to(torch.int64)[:, None] + torch.arange(W, device=dw.device)[None, :]
            feats = batch_result.logits_output.hidden_states.view(bs, W, -1)
            slots = window_slots(dw, batch, kv_loc_plan).view(bs, W)
            self.context.write(feats[take], pos[take], slots[take])
        dw.relay_placeholders(batch_result.next_draft_input)  # verify set the next bonus tokens
        batch_result.logits_output.hidden_states = None
