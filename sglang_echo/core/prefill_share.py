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

Per request, an arm that prefills ``n`` requests a batch pays ``P(n) / n``. Spread over the
request's decode time at batch ``B`` (``L`` tokens, ``t_plain(B) / B`` each), drafting's prefill
charge is the fraction

    charge(B) = max(B (P(n_draft) / n_draft - P(n_plain) / n_plain), 0) / (L t_plain(B))

of plain decoding's time: 0 at one request (nothing to batch), 0 where prefills cost in
proportion to their requests (compute-bound, uncached prompts: nothing saved by batching), and
smaller the longer the replies. ``n_plain`` and ``n_draft`` are the requests per prefill batch
each arm has been seen to give at this load (batch-size half-octave): a prefill counts for the
arm of most decode steps since the one before it. Until an arm is measured at a load its bound
stands in, ``n_plain = B`` (every wave prefilled together) and ``n_draft = 1``, the upper bound
the charge started as. Plain decoding keeps requests together less than that bound says, since
replies end at their own lengths: at 8 closed-loop requests on a CPU it prefilled 2.5 requests a
batch and drafting 1.2, and the bound's premium (0.22-0.27) kept the budget plain where drafting
at a fixed cap of 32 served 1.06x plain decoding.

:class:`PrefillShare` measures ``P`` per batch size (:class:`~.cost_curve.CostCurve`), each arm's
``n`` per load, and ``L`` as decoded tokens per prefilled request over the last prefill batches,
so all follow the workload; a chunked prompt counts once per chunk, which shortens ``L`` and so
errs on the side of plain decoding.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Optional

from .cost_curve import CostCurve, half_octave
from .served_rates import RealisedRates

ARMS = RealisedRates.ARMS  # the budget's two arms, as its served A/B test names them


class PrefillShare:
    """The prefill charge of drafting at a load (the module docstring), as measured while serving."""

    def __init__(
        self, decay: float = 0.98, window: int = 32, min_prefills: int = 4, batching_decay: float = 0.9
    ) -> None:
        """``decay``: the prefill cost curve's, per prefill; ``window``: the prefill batches ``L``
        is measured over (tokens decoded since the oldest, per request prefilled after it);
        ``min_prefills``: the fewest it is measured on (fewer: no charge); ``batching_decay``: the
        arms' requests per prefill batch, per prefill (about the last ten)."""
        if not 0 < decay <= 1 or not 0 < batching_decay <= 1 or not 2 <= min_prefills <= window:
            raise ValueError(
                f"need 0 < decay <= 1, 0 < batching_decay <= 1 and 2 <= min_prefills <= window; got "
                f"decay={decay} batching_decay={batching_decay} window={window} min_prefills={min_prefills}"
            )
        self.batching_decay = batching_decay
        self._batched: dict[tuple[str, int], list[float]] = {}  # (arm, load bucket) -> [w, w requests]
        self.prefill = CostCurve(decay, outlier=4.0)  # seconds per prefill batch vs its requests
        self.min_prefills = min_prefills
        self._decoded = 0  # tokens decoded so far
        self._prefills: deque[tuple[int, int]] = deque(maxlen=window)  # (tokens decoded before it, requests)

    def observe_prefill(
        self, requests: int, seconds: float, *, arm: Optional[str] = None, load: Optional[int] = None
    ) -> None:
        """One prefill batch of ``requests`` new requests that took ``seconds``; ``arm``: the arm
        of most decode steps since the last prefill, ``load``: the decode batch it joins (both or
        neither: without them the batch counts for no arm's ``n``)."""
        if requests <= 0:
            return
        self.prefill.add(requests, seconds)
        self._prefills.append((self._decoded, requests))
        if arm is not None and load is not None:
            if arm not in ARMS:
                raise ValueError(f"arm must be one of {ARMS}, got {arm!r}")
            b = self._batched.setdefault((arm, half_octave(load)), [0.0, 0.0])
            b[0] = self.batching_decay * b[0] + 1.0
            b[1] = self.batching_decay * b[1] + requests

    def requests_per_prefill(self, arm: str, batch_size: int) -> Optional[float]:
        """Requests per prefill batch ``arm`` has given at this load, None where not measured."""
        b = self._batched.get((arm, half_octave(batch_size)))
        return None if b is None else b[1] / b[0]

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
        together = self.requests_per_prefill("plain", batch_size)
        together = float(batch_size) if together is None else min(max(together, 1.0), batch_size)
        apart = self.requests_per_prefill("draft", batch_size)
        apart = 1.0 if apart is None else min(max(apart, 1.0), together)
        per_request = self.prefill.predict(apart) / apart - self.prefill.predict(together) / together
        return max(batch_size * per_request, 0.0) / (length * plain_step_s)
