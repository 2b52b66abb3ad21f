"""One strategy per drafter with a head: what the ECHO step in sglang's EAGLE draft worker asks it.

:class:`~.draft_worker.EchoDraftWorker` runs every stage of a step the same way whatever the
drafter, and delegates what differs to its :class:`StepDrafter`:

================  =====================  ==========================  ==============================
stage             EAGLE-3 (.drafter)     DART (.dart)                DFlash (.dflash)
================  =====================  ==========================  ==============================
model             sglang's EAGLE-3 head  ``LlamaForCausalLMDart``,   sglang's ``DFlashDraftModel``
                                         registered before loading   (loads and sizes the pool)
attach            nothing                the head checked, its       nothing
                                         search, ``TokenHistory``
frontier drafter  one draft forward per  one mask forward, DART's    one block forward over the
                  depth over the         COMBINE search              context in the draft KV pool
                  frontier
LM head           sglang's               sglang's                    the head on the target's
                                                                     embedding and LM head
CUDA graphs       sglang's               sglang's                    none (eager block forward)
draft extends     sglang's draft layer   sglang's draft layer        write the context, relay
                                                                     zeroed placeholders
lazy extend       yes                    yes                         no (no draft-layer extend)
================  =====================  ==========================  ==============================

The defaults below are sglang's own EAGLE stages, which the draft worker keeps under ``eagle_*``
names; a drafter overrides what it does differently (and says whether it draws on EAGLE's draft
extend and on sglang's draft CUDA graphs). :func:`make_step_drafter` is the one place a
drafter's name maps to its strategy.

The n-gram drafter has no model and runs in sglang's NGRAM worker, where none of these stages
exist: its frontier drafter for a step is :class:`~.ngram_worker.BatchDrafter` over the requests'
own drafters (:class:`~.ngram_worker.RequestDrafters`), and that worker shares the step epilogue
(:class:`~.session.EchoSession`) with this one.
"""

from __future__ import annotations

import pkgutil
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from torch import Tensor

from .config import Drafter

# Where each strategy lives, imported on use: DART's module imports sglang's EAGLE-3 model class.
STEP_DRAFTERS: dict[str, str] = {
    Drafter.EAGLE3: "sglang_echo.integration.drafter:EagleDrafting",
    Drafter.DART: "sglang_echo.integration.dart:DartDrafting",
    Drafter.DFLASH: "sglang_echo.integration.dflash:DFlashDrafting",
}


class StepDrafter(ABC):
    """A drafter's side of the ECHO step inside sglang's EAGLE draft worker (module docstring).

    Every method gets the draft worker ``dw`` (an :class:`~.draft_worker.EchoDraftWorker`): its
    sglang state (``draft_runner``, ``req_to_token_pool``, ``topk``, ...) and its
    :class:`~.session.EchoSession` (``dw.echo``)."""

    kind: ClassVar[str]
    # The roots' children come from EAGLE's draft extend (spec_info.topk_p / topk_index), so a
    # plain step may defer that extend and catch up later (.lazy_extend).
    drafts_from_extend: ClassVar[bool] = True
    # sglang captures the draft model's CUDA graphs (the draft extend's); False: the drafter's
    # forwards run eagerly.
    draft_graphs: ClassVar[bool] = True

    def register_model(self) -> None:
        """Before sglang loads the draft model (the draft worker's constructor, first)."""

    def attach(self, dw) -> None:
        """Once the draft model is loaded (the draft worker's constructor, last)."""

    @abstractmethod
    def frontier(self, dw, batch, forward_batch, roots: Tensor) -> Any:
        """The core's drafter (``propose(frontier, k) -> Candidates``, a ``forwards`` count) for
        this step of ``batch``: ``forward_batch`` is sglang's draft-decode batch (the draft tokens'
        KV slots, ``prepare_for_draft``), ``roots [bs]`` the requests' bonus tokens."""

    def init_lm_head(self, dw) -> None:
        """When sglang allocates the draft pools (``alloc_memory_pool``)."""
        dw.eagle_init_lm_head()

    def extend_for_prefill(self, dw, batch, target_hidden_states, next_token_ids, mm_input_embeds, kv_loc_plan):
        """After a prefill: returns the next step's draft input (sglang's ``EagleDraftInput``)."""
        return dw.eagle_extend_for_prefill(
            batch, target_hidden_states, next_token_ids, mm_input_embeds, kv_loc_plan=kv_loc_plan
        )

    def extend_for_decode(self, dw, batch, batch_result, kv_loc_plan) -> None:
        """After a verify, over the committed tokens: sets ``batch_result.next_draft_input``'s
        relayed state (the roots' children, the hidden states)."""
        return dw.eagle_extend_for_decode(batch, batch_result, kv_loc_plan=kv_loc_plan)


def make_step_drafter(kind: str) -> StepDrafter:
    """The strategy of drafter ``kind`` (``eagle3``, ``dart``, ``dflash``)."""
    where = STEP_DRAFTERS.get(kind)
    if where is None:
        raise ValueError(
            f"ECHO drafter {kind!r} has no head to run in sglang's EAGLE draft worker "
            f"(drafters with one: {', '.join(STEP_DRAFTERS)}; 'ngram' runs in EchoNgramWorker)"
        )
    return pkgutil.resolve_name(where)()
