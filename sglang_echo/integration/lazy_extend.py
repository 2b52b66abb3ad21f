"""Lazy catch-up of EAGLE's draft KV over plain steps (WhiFlash's Lazy Catch-up, ``000_*``).

After every verify, ``EAGLEWorkerV2`` runs the draft extend: the draft layer over the pairs
``(target features at p, token at p + 1)`` just committed, which writes their draft KV and
gives the top-k children of the next root (``spec_info.topk_p`` / ``topk_index``). A plain
step (every ``K_i = 1``: ``budget: cost`` chose plain decoding, or the gates cut every tree)
has no use for those children unless the next step drafts, yet the extend cost about 6% of
such a step on the CPU.

So on a plain step the worker only records each request's pair here (:func:`defer_extend`),
and :func:`catch_up` runs one draft extend over every pending pair of the requests
that have some, right before a step that may draft (or when a backlog is full). The draft KV
it writes and the children it computes are exactly what the per-step extends would have given:
a pair's KV depends on the pair alone, and causal attention over the positions in order
computes the same outputs whether they come one per forward or all in one. Until then the
relayed top-k of a pending request is a zero placeholder (probability 0: never proposed).

A prefill's draft extend waits the same way (:func:`defer_prefill`) on a server without the
radix cache (:func:`prefills_may_wait`), when each request's new tokens and its longest reply fit
its backlog: its pairs are the prompt's (features at ``p``, token at ``p + 1``, the sampled token
after the last). A request that never drafts (a batch at or over ``K_max``) then never pays for
it. The prompt's catch-up runs in the request's first drafting step, whose time the cost budget
charges to drafting: a request decoded plainly to its end never needs it. With the radix cache
(sglang's default) every prefill extends at once: the cache shares a prompt's KV slots, draft KV
included, with each later request whose prompt starts the same way as soon as the prefill ends,
and a deferred prompt's draft KV stays unwritten until its request drafts, forever if it never
does. A request reusing such a prompt drafted over the gap (confidences off by up to 0.17 on
SmolLM2 where the eager extend's are within 3e-6).

The backlog is indexed by the request's ``req_pool_idx``: it is stable while the request lives,
so filtering and merging batches needs nothing, and a prefill (a new request in the slot, or a
retracted one coming back) clears it. Host-side lengths decide without a device sync.

Known limit: a request that finishes with pairs still pending leaves the draft KV of those
positions unwritten, and sglang's radix cache keeps the finished sequence's KV slots for reuse.
A later request that extends the cached sequence (the next turn of a chat) drafts over that gap
in its draft attention. The output stays exact, because the target verifies every token, but those
drafts are worse than an eager extend's. Catching up at finish would need a hook into sglang's
request-finish path, and would also spend the work that deferring saves.
"""

from __future__ import annotations

import copy
import logging
from typing import Optional

import torch
from torch import Tensor

log = logging.getLogger(__name__)


class DraftBacklog:
    """Pending draft pairs per request-pool slot: features ``[slots, capacity, F]``, tokens, lengths.

    ``capacity`` (the ``lazy_extend`` setting) bounds both the memory and how far a request's
    draft KV may lag: a full backlog is caught up at once. Such a forced catch-up does the work
    the per-step extends would have done; what deferring saves is the pairs of requests that end
    before they draft again. At 32, a batch of 64-96-token replies caught up all its requests
    every 32 plain steps; 128 (SmolLM2's EAGLE-3 head: 1,728 fp32 features, 0.84 MiB per slot)
    lets most replies end first."""

    def __init__(self, num_slots: int, device, capacity: int) -> None:
        self.num_slots, self.device, self.capacity = num_slots, device, capacity
        self.lens = torch.zeros(num_slots, dtype=torch.int64)  # host side
        self.feats: Optional[Tensor] = None  # allocated on the first append (F and dtype are the target's)
        self.tokens = torch.zeros(num_slots, capacity, dtype=torch.int64, device=device)

    def clear(self, slots: list[int]) -> None:
        self.lens[slots] = 0

    def pending(self, slots: list[int]) -> Tensor:
        return self.lens[slots]

    def full(self, slots: list[int]) -> bool:
        """Whether any slot's backlog has no room for one more pair."""
        return bool((self.lens[slots] >= self.capacity).any())

    def append(self, slots: list[int], feats: Tensor, tokens: Tensor) -> None:
        """One pair per request: ``feats [bs, F]`` at each request's next position, ``tokens [bs]``.
        Every plain step appends, so its cells are each slot's next column, without
        :meth:`extend`'s ragged layout."""
        slots_t = torch.tensor(slots, dtype=torch.int64)
        n = self.lens[slots_t]
        self._write(slots_t, n + 1, slots_t * self.capacity + n, feats, tokens)

    def fits(self, slots: list[int], counts: Tensor) -> bool:
        """Whether ``counts [bs]`` more pairs fit each slot's backlog."""
        return bool((self.lens[slots] + counts <= self.capacity).all())

    def extend(self, slots: list[int], counts: Tensor, feats: Tensor, tokens: Tensor) -> None:
        """``counts[i]`` pairs for request ``i`` (host ``int64 [bs]``), packed back to back in
        ``feats [sum counts, F]`` and ``tokens [sum counts]`` in position order."""
        slots_t = torch.tensor(slots, dtype=torch.int64)
        n = self.lens[slots_t]
        starts = torch.cumsum(counts, 0) - counts  # each request's first row in feats
        rows = torch.repeat_interleave(torch.arange(len(slots)), counts)
        columns = n[rows] + torch.arange(int(counts.sum())) - starts[rows]
        self._write(slots_t, n + counts, slots_t[rows] * self.capacity + columns, feats, tokens)

    def _write(self, slots: Tensor, lens: Tensor, cells: Tensor, feats: Tensor, tokens: Tensor) -> None:
        """Pairs into ``cells`` (row-major ``slot * capacity + column``, host ``int64``); the slots'
        lengths become ``lens``, refused past the capacity."""
        if bool((lens > self.capacity).any()):
            raise RuntimeError("ECHO lazy extend: backlog full; catch up before appending")
        if self.feats is None:
            # Uninitialised: a cell is read only once written (``lens``), and zero-filling the whole
            # backlog (217 MiB for SmolLM2 on 257 slots) cost the first plain step 58 ms on a CPU,
            # an outlier the cost budget's plain-step rest then carried for tens of steps.
            self.feats = torch.empty(
                self.num_slots, self.capacity, feats.shape[-1], dtype=feats.dtype, device=self.device
            )
            log.info(
                "ECHO lazy extend: backlog of %d slots x %d pairs x %d features, %.0f MiB",
                self.num_slots,
                self.capacity,
                feats.shape[-1],
                self.feats.numel() * self.feats.element_size() / 2**20,
            )
        cells = cells.to(self.device)
        self.feats.view(-1, self.feats.shape[-1]).index_copy_(0, cells, feats.to(self.feats.dtype))
        self.tokens.view(-1).index_copy_(0, cells, tokens.to(torch.int64))
        self.lens[slots] = lens


def lazy_extend_applies(server_args, cfg) -> bool:
    """Whether a server defers plain steps' draft extends: ``lazy_extend`` is on (its backlog
    capacity, > 0) and there is no overlap scheduling (whose relayed draft state and lengths this
    was not built for). Only for drafters that draft from EAGLE's draft extend
    (:attr:`.drafting.StepDrafter.drafts_from_extend`)."""
    if cfg.lazy_extend == 0:
        return False
    if not server_args.disable_overlap_schedule:
        log.info("ECHO worker: lazy extend off under overlap scheduling (every step extends the draft KV)")
        return False
    return True


def prefills_may_wait(server_args) -> bool:
    """Whether a lazy-extend server defers prefills' draft extends too (:func:`defer_prefill`):
    only without the radix cache, which would share a deferred prompt's unwritten draft KV with
    the requests that reuse the prompt (module docstring)."""
    return bool(server_args.disable_radix_cache)


def pool_slots(batch) -> list[int]:
    """The batch's request-pool slots, from sglang's host copy where it keeps one."""
    cpu = getattr(batch, "req_pool_indices_cpu", None)
    if cpu is not None and cpu.numel() == batch.req_pool_indices.numel():
        return cpu.tolist()
    return batch.req_pool_indices.tolist()


def root_positions(batch) -> Tensor:
    """Each request's root position (its committed length, ``seq_lens``), on the host, from
    sglang's host copy where it keeps one."""
    return batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens.cpu()


def catch_up(worker, batch, draft_input, backlog: DraftBacklog) -> int:
    """One draft extend over the pending pairs of ``batch``'s requests; returns the pairs extended.

    ``batch.seq_lens`` is each request's root position (before a step's verify, or at its draft),
    so its ``n`` pending pairs sit at ``seq_lens - n .. seq_lens - 1``. The extend's last-position
    top-k and hidden state go into ``draft_input``'s rows (the root's children, as after an eager
    extend).
    """
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput
    from sglang.srt.speculative.spec_utils import fast_topk, renorm_draft_probs

    slots = pool_slots(batch)
    n_all = backlog.pending(slots)
    rows = torch.nonzero(n_all > 0).flatten()
    if rows.numel() == 0:
        return 0
    n, q = n_all[rows], root_positions(batch)[rows].to(torch.int64)
    rows_list = rows.tolist()
    pending_slots = [slots[i] for i in rows_list]
    dev = worker.device
    rows_dev = rows.to(dev)
    slot_rows = torch.tensor(pending_slots, device=dev)
    take = torch.arange(backlog.capacity, device=dev)[None, :] < n.to(dev)[:, None]  # [m, C]
    positions = (q - n).to(dev)[:, None] + torch.arange(backlog.capacity, device=dev)[None, :]
    req_to_token = worker.req_to_token_pool.req_to_token
    kv_slots = req_to_token[slot_rows[:, None], positions.clamp(max=req_to_token.shape[1] - 1)]

    # The batch's fields, narrowed to the requests that have pairs and laid out as an extend
    # (prefix = committed draft KV, extend = the pairs), as a prefill's draft extend sees them.
    sub = copy.copy(batch)
    sub.reqs = [batch.reqs[i] for i in rows_list]
    sub.req_pool_indices = batch.req_pool_indices[rows_dev]
    sub.seq_lens = q.to(dev, dtype=batch.seq_lens.dtype)
    sub.seq_lens_cpu = q.to(torch.int64)
    sub.orig_seq_lens = None if batch.orig_seq_lens is None else sub.seq_lens.to(batch.orig_seq_lens.dtype)
    sub.seq_lens_sum = int(q.sum())
    sub.prefix_lens, sub.extend_lens = (q - n).tolist(), n.tolist()
    sub.extend_num_tokens = int(n.sum())
    sub.extend_logprob_start_lens = [0] * len(rows_list)
    sub.multimodal_inputs = [None] * len(rows_list)
    sub.forward_mode = ForwardMode.EXTEND
    sub.return_logprob, sub.top_logprobs_nums, sub.token_ids_logprobs = False, None, None
    sub.sampling_info = None  # the draft forward samples nothing
    sub.input_ids = backlog.tokens[slot_rows][take]
    sub.out_cache_loc = kv_slots[take].to(torch.int64)
    sub.spec_info = EagleDraftExtendInput(
        hidden_states=backlog.feats[slot_rows][take], num_tokens_per_req=1, num_tokens_for_logprob_per_req=1
    )
    fb = ForwardBatch.init_new(
        sub, worker.draft_runner, capture_hidden_mode=CaptureHiddenMode.LAST, return_hidden_states_before_norm=False
    )
    fb.return_logprob = False
    out = worker.draft_runner.forward(fb).logits_output
    backlog.clear(pending_slots)

    topk_p, topk_index = fast_topk(renorm_draft_probs(out.next_token_logits, None, False), worker.topk, dim=-1)
    draft_input.topk_p[rows_dev] = topk_p.to(draft_input.topk_p.dtype)
    draft_input.topk_index[rows_dev] = topk_index.to(draft_input.topk_index.dtype)
    if draft_input.hidden_states is not None and out.hidden_states is not None:
        draft_input.hidden_states[rows_dev] = out.hidden_states.to(draft_input.hidden_states.dtype)
    return int(n.sum())


def defer_prefill(worker, batch, target_hidden_states: Tensor, next_token_ids: Tensor, mm_input_embeds):
    """A prefill's draft extend, deferred where it can wait: its pairs go into the backlog (each
    slot was cleared for its new request) and the requests relay the placeholder draft input it
    returns, as after a plain step. Returns None, deferring nothing, for a batch that must extend now:
    multimodal inputs (the catch-up feeds token ids only), a request between chunks of a chunked
    prefill (its next chunk's prefill clears its slot), or a request whose new tokens and longest
    reply (``max_new_tokens``) may not fit its backlog. Deferring never fills a backlog, so it never
    forces a catch-up the eager extend would not have: a request that plain-decodes to its end
    never extends, and one that drafts extends its prompt once, in the catch-up before."""
    if mm_input_embeds is not None or batch.chunked_req_next_prompt_token is not None:
        return None
    backlog, slots = worker.echo_backlog, pool_slots(batch)
    counts = torch.tensor(batch.extend_lens, dtype=torch.int64)
    replies = [r.sampling_params.max_new_tokens for r in batch.reqs]
    if None in replies or not backlog.fits(slots, counts + torch.tensor(replies, dtype=torch.int64)):
        return None
    # The pair at p is (features at p, token at p + 1): the prompt shifted left by one, each
    # request's last position followed by its sampled token (sglang's prefill extend, unchunked).
    ids = batch.input_ids
    tokens = torch.empty_like(ids)
    tokens[:-1] = ids[1:]
    tokens[(torch.cumsum(counts, 0) - 1).to(ids.device)] = next_token_ids.to(ids.dtype)
    backlog.extend(slots, counts, target_hidden_states, tokens)
    worker.record_lazy(deferred=int(counts.sum()))
    return worker.placeholder_draft_input(next_token_ids)


def defer_extend(worker, batch, batch_result) -> None:
    """A plain step's draft extend, deferred: keep each request's pair (the root's features, the
    bonus token after it) in the draft worker's backlog, catching a full backlog up first."""
    bs, W = batch.seq_lens.shape[0], worker.echo_step.width
    slots = pool_slots(batch)
    nxt = batch_result.next_draft_input
    worker.relay_placeholders(nxt)
    if worker.echo_backlog.full(slots):  # the pending pairs end right before this step's roots
        worker.record_lazy(caught_up=catch_up(worker, batch, nxt, worker.echo_backlog))
    feats = batch_result.logits_output.hidden_states.view(bs, W, -1)[:, 0]
    worker.echo_backlog.append(slots, feats, batch_result.next_token_ids.view(bs, -1)[:, 0])
    worker.record_lazy(deferred=bs)
