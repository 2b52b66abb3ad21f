"""What drafting costs outside its own steps: requests that end apart are prefilled apart.

Under closed-loop clients (each sends its next request when the last one ends) requests of equal
length that decode one token a step end together, and their successors are prefilled together,
in one batch. Drafting advances each request by what its drafts earned, so they end apart and
each successor is prefilled alone: sglang runs a prefill as its own step (it refuses mixed
prefill and decode batches with speculative decoding), the decode batch waits for each, and
where a prefill costs about as much for one request as for several (a cached prompt on a CPU
reads every weight once, like a decode step) the batch pays that wait once per request instead
of once per wave. On the CPU at 8 requests this was most of what drafting lost: its decode steps
took as long in all as plain decoding's, its prefills 2.1 s more in 70 batches against 45.

Per request, plain decoding's share of a ``B``-request prefill is ``P(B) / B``; a request
prefilled alone costs ``P(1)``. Spread over the request's decode time at batch ``B``
(``L`` tokens, ``t_plain(B) / B`` each), drafting's prefill charge is the fraction

    charge(B) = max(B P(1) - P(B), 0) / (L t_plain(B))

of plain decoding's time: 0 at one request (nothing to batch), 0 where prefills cost in
proportion to their requests (compute-bound, uncached prompts: nothing saved by batching), and
smaller the longer the replies. It is an upper bound (drafting desynchronises only the requests
it advances), which is what a premium should be. :class:`PrefillShare` measures ``P`` per batch
size (:class:`~.cost_curve.CostCurve`) and ``L`` as decoded tokens per prefilled request over the
last prefill batches, so both follow the workload; a chunked prompt counts once per chunk, which
shortens ``L`` and so errs on the side of plain decoding.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Optional

from .cost_curve import CostCurve


class PrefillShare:
    """The prefill charge of drafting at a load (the module docstring), as measured while serving."""

    def __init__(self, decay: float = 0.98, window: int = 32, min_prefills: int = 4) -> None:
        """``decay``: the prefill cost curve's, per prefill; ``window``: the prefill batches ``L``
        is measured over (tokens decoded since the oldest, per request prefilled after it);
        ``min_prefills``: the fewest it is measured on (fewer: no charge)."""
        if not 0 < decay <= 1 or not 2 <= min_prefills <= window:
            raise ValueError(
                f"need 0 < decay <= 1 and 2 <= min_prefills <= window; got decay={decay} "
                f"window={window} min_prefills={min_prefills}"
            )
        self.prefill = CostCurve(decay, outlier=4.0)  # seconds per prefill batch vs its requests
        self.min_prefills = min_prefills
        self._decoded = 0  # tokens decoded so far
        self._prefills: deque[tuple[int, int]] = deque(maxlen=window)  # (tokens decoded before it, requests)

    def observe_prefill(self, requests: int, seconds: float) -> None:
        """One prefill batch of ``requests`` new requests that took ``seconds``."""
        if requests > 0:
            self.prefill.add(requests, seconds)
            self._prefills.append((self._decoded, requests))

    def observe_decoded(self, tokens: int) -> None:
        """One decode step that committed ``tokens`` tokens over its batch."""
        self._decoded += tokens

    def reply_length(self) -> Optional[float]:
        """``L``: tokens decoded since the oldest prefill batch remembered, per request prefilled
        after it (None before ``min_prefills`` batches). Closed-loop waves bias it by at most a
        wave over the window (the tokens of the wave decoding now)."""
        if len(self._prefills) < self.min_prefills:
            return None
        since = self._prefills[0][0]
        requests = sum(r for _, r in itertools.islice(self._prefills, 1, None))
        return (self._decoded - since) / requests if self._decoded > since else None

    def charge(self, batch_size: int, plain_step_s: float) -> float:
        """Drafting's prefill charge at ``batch_size`` requests, as a fraction of plain decoding's
        time; ``plain_step_s``: a plain decode step's seconds at that size. 0 until measured."""
        length = self.reply_length()
        if batch_size <= 1 or length is None or plain_step_s <= 0:
            return 0.0
        saved = batch_size * self.prefill.predict(1) - self.prefill.predict(batch_size)
        return max(saved, 0.0) / (length * plain_step_s)
