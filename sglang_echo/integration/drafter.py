"""``drafter: eagle3``: the core's drafter protocol (``propose(frontier, k) -> Candidates``) on
EAGLE-3's draft model, and its :class:`EagleDrafting` step strategy (:mod:`.drafting`).

Interleaved drafting: the policy chooses, depth by depth, which candidates
the draft model expands next; this drafter runs one EAGLE draft-decode forward per depth over
the chosen frontier and returns each frontier node's top-``k`` children.

Layout. sglang's draft KV window per request is ``topk`` lanes x ``num_steps`` steps
(``prepare_for_draft``); each draft forward runs ``bs * L`` rows (lane f of request b is row
``b*L + f``), writes its KV into its lanes' ``out_cache_loc[step]`` and attends to the prefix plus
its own lane's earlier steps. Frontier slot f is put in lane f; slots the policy leaves empty (or
whole inactive requests) are fed a harmless duplicate (lane 0's token and hidden state) and their
proposals are masked invalid. ``L`` is ``topk``, or, where the draft attention backend runs lane
subsets (``select_lanes``: the CPU platform's), the frontier's widest request: a chain-shaped
step at 8 requests runs 8 rows instead of 32, with the same outputs. As in upstream EAGLE (whose
``select_top_k_tokens`` also re-picks parents across lanes), a lane's earlier KV is not
necessarily its node's ancestor path: that only affects draft quality, never correctness,
because the target verifies every token.

Depth 0 needs no forward: the roots' children are the ``topk_p``/``topk_index`` computed by the
previous step's draft extend (``EagleDraftInput``). Everything else of the step is sglang's EAGLE
plumbing (the draft model, the LM head, the draft extends): :class:`EagleDrafting` keeps
:class:`~.drafting.StepDrafter`'s defaults and adds only the frontier drafter.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from sglang_echo.core.policy import Frontier
from sglang_echo.core.tree import Candidates
from sglang_echo.drafters.base import adopt_columns

from .config import Drafter
from .drafting import StepDrafter
from .simulate import simulated


def draft_extend_topk(worker, spec_info) -> tuple[Tensor, Tensor]:
    """The roots' children that the previous step's draft extend computed: ``(probs, target ids)``,
    ``[bs, topk]`` each (draft-vocabulary ids mapped through the hot-token map)."""
    topk_index = spec_info.topk_index
    if worker.hot_token_id is not None:
        topk_index = worker.hot_token_id[topk_index]
    return spec_info.topk_p, topk_index


class EagleFrontierDrafter:
    def __init__(self, worker, forward_batch, spec_info, out_cache_loc: Tensor):
        """``worker`` is the (ECHO) EagleDraftWorker; ``out_cache_loc`` is ``[steps, bs*topk]``."""
        self.w = worker
        self.fb = forward_batch
        self.topk = worker.topk
        self.bs = forward_batch.batch_size
        self.out_cache_loc = out_cache_loc
        self.root_p, self.root_index = draft_extend_topk(worker, spec_info)  # [bs, topk]
        self.positions = forward_batch.positions  # [bs * topk], every lane's, advanced per depth
        backend = worker.draft_attn_backend
        mrope = worker.draft_runner.model_config.model_is_mrope
        self.lane_subsets = hasattr(backend, "select_lanes") and not mrope
        self.lanes = self.topk  # lanes the last draft forward ran (rows of self._hidden per request)
        # Hidden state each candidate of the last proposal would be expanded with, and where.
        self._hidden: Tensor = spec_info.hidden_states  # [rows, H]
        self._cand_rows: Optional[Tensor] = None  # [bs, C] row into self._hidden
        self._root_step = True  # the last propose expanded the roots
        self.forwards = 0

    # -- the protocol ------------------------------------------------------------------------
    def propose(self, frontier: Frontier, k: int) -> Candidates:
        k = min(k, self.topk)
        self._root_step = frontier.depth == 0
        if frontier.depth == 0:
            probs, index = self.root_p[:, :k], self.root_index[:, :k]
            parent = torch.zeros_like(index, dtype=torch.int64)
            valid = frontier.valid[:, :1].expand_as(index)
            rows = torch.arange(self.bs, device=index.device)[:, None].expand_as(index)
            return self._candidates(probs, index, parent, valid, rows)
        probs, index = self._expand(frontier, k)  # [bs, F, k]
        B, F = frontier.slots.shape
        parent = torch.arange(F, device=index.device)[None, :, None].expand(B, F, k)
        valid = frontier.valid[:, :, None].expand(B, F, k)
        rows = self._lane_rows(torch.arange(B, device=index.device)[:, None, None], parent)
        return self._candidates(
            probs.reshape(B, F * k),
            index.reshape(B, F * k),
            parent.reshape(B, F * k),
            valid.reshape(B, F * k),
            rows.reshape(B, F * k),
        )

    def adopt(self, parent: Tensor, tokens: Tensor, *, before: bool) -> None:
        """Foreign children of frontier slot ``f`` (:class:`~sglang_echo.drafters.hybrid.HybridDrafter`)
        are expanded from the row that expanded ``f``, as the head's own children of ``f`` are:
        request ``b``'s root row at depth 0, else lane ``f`` of request ``b``."""
        B = parent.shape[0]
        b = torch.arange(B, device=parent.device)[:, None]
        rows = b.expand_as(parent) if self._root_step else self._lane_rows(b, parent)
        self._cand_rows = adopt_columns(self._cand_rows, rows.to(self._cand_rows), before)

    # -- internals ---------------------------------------------------------------------------
    def _candidates(self, probs, index, parent, valid, rows) -> Candidates:
        self._cand_rows = rows
        valid = valid & (probs > 0)
        logprob = torch.log(probs.float().clamp(min=1e-30))
        return Candidates(tokens=index.long(), logprob=logprob, parent=parent.long(), valid=valid)

    def _expand(self, frontier: Frontier, k: int) -> tuple[Tensor, Tensor]:
        """One draft-decode forward over the frontier's lanes: ``[B, F, k]`` children, zero
        probability where a slot was not run."""
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
        from sglang.srt.speculative.spec_utils import fast_topk, renorm_draft_probs

        B, F = frontier.slots.shape
        T = self.topk
        if F > T:
            raise RuntimeError(f"ECHO policy asked for a frontier of {F} nodes per request, more than topk={T}")
        step = frontier.depth - 1  # depth-1 frontier is the first forward (upstream step 0)
        valid = frontier.valid
        L = self.lanes = self._lanes(valid)
        # Source candidate column of each frontier slot -> hidden-state row; empty -> lane 0.
        src = frontier.source[:, :L].clamp(min=0)
        rows = self._cand_rows.gather(1, src)  # [B, min(F, L)]
        # Empty slots (and inactive requests) duplicate lane 0; their children are masked out.
        rows = torch.where(valid[:, :L], rows, rows[:, :1])
        tokens = torch.where(valid[:, :L], frontier.tokens[:, :L], frontier.tokens[:, :1])
        if rows.shape[1] < L:  # pad lanes with duplicates of lane 0
            rows = torch.cat([rows, rows[:, :1].expand(B, L - rows.shape[1])], 1)
            tokens = torch.cat([tokens, tokens[:, :1].expand(B, L - tokens.shape[1])], 1)
        hidden = self._hidden[rows.flatten()]
        fb, w = self.fb, self.w
        fb.input_ids = tokens.flatten().to(torch.int64)
        fb.out_cache_loc = self._first_lanes(self.out_cache_loc[step], L)
        fb.positions = self._first_lanes(self.positions, L)
        fb.spec_info.hidden_states = hidden
        if self.lane_subsets:
            w.draft_attn_backend.select_lanes(step, L)
        with forward_context(ForwardContext(attn_backend=w.draft_attn_backend.attn_backends[step]), forward_batch=fb):
            logits_output = w.draft_runner.forward(fb).logits_output
        fb.positions = self.positions.add_(1)
        if w.draft_runner.model_config.model_is_mrope:
            fb.mrope_positions.add_(1)
        self.forwards += 1
        probs = renorm_draft_probs(logits_output.next_token_logits, fb.sampling_info, False)
        topk_p, topk_index = fast_topk(probs, T, dim=-1)
        if w.hot_token_id is not None:
            topk_index = w.hot_token_id[topk_index]
        self._hidden = logits_output.hidden_states  # [B*L, H]
        topk_p, topk_index = topk_p.view(B, L, T)[:, :F, :k], topk_index.view(B, L, T)[:, :F, :k]
        if L < F:  # slots beyond the lanes run: never valid (see _lanes)
            topk_p = torch.cat([topk_p, topk_p.new_zeros(B, F - L, k)], 1)
            topk_index = torch.cat([topk_index, topk_index.new_zeros(B, F - L, k)], 1)
        return topk_p, topk_index

    def _lanes(self, valid: Tensor) -> int:
        """Lanes this forward runs: ``topk``, or with lane subsets the frontier's last column that
        holds a node of any request (every column beyond it is empty everywhere)."""
        if not self.lane_subsets:
            return self.topk
        used = valid.any(0)
        return max(1, int((used * torch.arange(1, used.numel() + 1, device=used.device)).max()))

    def _lane_rows(self, b: Tensor, parent: Tensor) -> Tensor:
        """The last draft forward's row of frontier slot ``parent`` of request ``b`` (a slot beyond
        the lanes run is empty: any row of its request will do)."""
        return b * self.lanes + parent.clamp(max=self.lanes - 1)

    def _first_lanes(self, t: Tensor, lanes: int) -> Tensor:
        """The entries of each request's first ``lanes`` lanes of a ``[bs * topk]`` tensor."""
        return t if lanes == self.topk else t.view(self.bs, self.topk)[:, :lanes].reshape(-1)


class EagleDrafting(StepDrafter):
    """EAGLE-3's step: sglang's draft model and extends; one draft forward per depth (module docstring)."""

    kind = Drafter.EAGLE3

    def frontier(self, dw, batch, forward_batch, roots: Tensor):
        """:class:`EagleFrontierDrafter` over the step's draft lanes (under a simulation, serving the
        trace's candidates: :func:`.simulate.simulated`)."""
        from sglang.srt.speculative.eagle_utils import per_step_draft_out_cache_loc

        bs, steps = roots.numel(), dw.speculative_num_steps
        if dw.echo.policy.max_depth > 1 and steps > 1:
            dw.draft_attn_backend.init_forward_metadata(forward_batch)
            forward_batch.mark_forward_metadata_ready()
        out_cache_loc = per_step_draft_out_cache_loc(forward_batch.out_cache_loc, bs, dw.topk, steps)
        return simulated(EagleFrontierDrafter(dw, forward_batch, batch.spec_info, out_cache_loc), batch, roots)
