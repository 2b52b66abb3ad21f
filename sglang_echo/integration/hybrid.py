"""``hybrid: true``: a head drafter and each request's n-gram drafter draft one ECHO tree.

The step's frontier drafter (the head's: :mod:`.drafter`, :mod:`.dart`, :mod:`.dflash`) and one
:class:`~sglang_echo.drafters.ngram.NGramDrafter` per live request propose together through the
core's :class:`~sglang_echo.drafters.hybrid.HybridDrafter`: the head's children of every frontier
node plus what followed the node's context earlier in the request, duplicates merged, either
drafter expanding either's nodes. The policy, the budget and the verify are unchanged, so the
target still checks every token (lossless as any drafter).

The n-gram drafters are :class:`~.ngram_worker.RequestDrafters` (the n-gram worker's, keyed by
``rid``), caught up each step from the request's committed tokens (``origin_input_ids_unpadded +
output_ids``) and forgotten when their request leaves the decode batch. A request whose committed
tokens do not end at this step's root (overlap scheduling, where ``output_ids`` lags a step)
gets the head's children only that step.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from sglang_echo.drafters.hybrid import HybridDrafter

from .history import History
from .ngram_worker import BatchDrafter, RequestDrafters


class RequestNgrams:
    """The draft worker's n-gram drafters, one per live request, and each step's hybrid drafter."""

    def __init__(self) -> None:
        self.drafters = RequestDrafters()

    def hybrid(self, head, reqs: Sequence, roots: Tensor) -> HybridDrafter:
        """``head`` (the step's frontier drafter) drafting together with the n-gram drafters of
        ``reqs`` (the decode batch; ``roots [bs]``: their last committed tokens)."""
        rows = []
        for req, root in zip(reqs, roots.tolist()):
            hist = History(req.origin_input_ids_unpadded, req.output_ids)
            rows.append(self.drafters.sync(req.rid, hist) if len(hist) and hist[-1] == root else None)
        self.drafters.retain(req.rid for req in reqs)
        return HybridDrafter(head, BatchDrafter(rows))
