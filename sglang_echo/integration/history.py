"""Every live request's committed tokens (prompt + output), for drafters that read them each step.

* :class:`History` views one request's token lists (``origin + output + extra``) without copying.
* :class:`TokenHistory` keeps them on the device, one row per live request, and each step writes
  only what a request committed since the step before. A step therefore costs host work in the
  batch size plus the new tokens, however long the requests are: DART's n-gram context
  (:mod:`.dart`) reads the whole history every step.

Rows are keyed by ``rid`` and live exactly as long as their request stays in the decode batch. A
request that leaves (finished, or retracted) frees its row; a history that no longer extends what
the row holds (a retracted request re-run, a reused rid) is rewritten from scratch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor


class History:
    """A request's committed tokens, ``origin + output + extra``, without copying them."""

    def __init__(self, origin: Sequence[int], output: Sequence[int], extra: Sequence[int] = ()):
        self.parts = (origin, output, extra)
        self._len = len(origin) + len(output) + len(extra)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> int:
        if i < 0:
            i += self._len
        for p in self.parts:
            if i < len(p):
                return int(p[i])
            i -= len(p)
        raise IndexError(i)

    def tail(self, start: int) -> list[int]:
        """Tokens ``[start, len)``."""
        out: list[int] = []
        for p in self.parts:
            if start < len(p):
                out.extend(int(x) for x in p[start:])
                start = 0
            else:
                start -= len(p)
        return out

    def extends(self, held: int, last: int) -> bool:
        """Whether these tokens continue a prefix of ``held`` tokens that ended in ``last``."""
        return held <= self._len and (held == 0 or self[held - 1] == last)


@dataclass
class _Row:
    row: int  # row of TokenHistory.tokens
    held: int = 0  # tokens written
    last: int = -1  # the last of them (to detect a rewritten history)


class TokenHistory:
    """Live requests' committed tokens on ``device``: :meth:`gather` -> ``(hist [B, L], len [B])``."""

    def __init__(self, device, rows: int = 8, width: int = 512):
        self.tokens = torch.zeros(rows, width, dtype=torch.int64, device=device)
        self._free = list(range(rows - 1, -1, -1))
        self._live: dict[object, _Row] = {}
        self.rewrites = 0  # histories that did not extend what their row held

    def __len__(self) -> int:
        return len(self._live)

    def gather(self, reqs) -> tuple[Tensor, Tensor]:
        """Catch every request of the batch up (``origin_input_ids_unpadded + output_ids``) and return
        the batch's histories and their lengths (what lies past a row's length is arbitrary)."""
        in_batch = {req.rid for req in reqs}
        for rid in [rid for rid in self._live if rid not in in_batch]:  # finished or retracted
            self._free.append(self._live.pop(rid).row)
        rows, lens, write_at, new_tokens = [], [], [], []
        for req in reqs:
            hist = History(req.origin_input_ids_unpadded, req.output_ids)
            st = self._live.get(req.rid)
            if st is not None and not hist.extends(st.held, st.last):
                st.held, self.rewrites = 0, self.rewrites + 1
            if st is None:
                st = self._live[req.rid] = _Row(self._take_row())
            n = len(hist)
            if n > st.held:
                new_tokens += hist.tail(st.held)
                write_at.append((st.row, st.held, n))
                st.held, st.last = n, hist[n - 1]
            rows.append(st.row)
            lens.append(n)
        self._write(write_at, new_tokens)
        dev = self.tokens.device
        L = max(lens, default=1)
        hist = self.tokens[torch.tensor(rows, dtype=torch.int64, device=dev), :L]
        return hist, torch.tensor(lens, dtype=torch.int64, device=dev)

    def _take_row(self) -> int:
        if not self._free:  # double the rows
            n = self.tokens.shape[0]
            self.tokens = torch.cat([self.tokens, torch.zeros_like(self.tokens)])
            self._free = list(range(2 * n - 1, n - 1, -1))
        return self._free.pop()

    def _write(self, spans: list[tuple[int, int, int]], tokens: list[int]) -> None:
        """One scatter of every new token: ``spans`` are ``(row, start, end)`` in order."""
        if not spans:
            return
        end = max(e for _, _, e in spans)
        if end > self.tokens.shape[1]:  # widen to the next power of two
            wider = torch.zeros(
                self.tokens.shape[0], 1 << (end - 1).bit_length(), dtype=self.tokens.dtype, device=self.tokens.device
            )
            wider[:, : self.tokens.shape[1]] = self.tokens
            self.tokens = wider
        row = [r for r, s, e in spans for _ in range(s, e)]
        col = [c for _, s, e in spans for c in range(s, e)]
        dev = self.tokens.device
        index = torch.tensor([row, col], dtype=torch.int64).to(dev)
        self.tokens[index[0], index[1]] = torch.tensor(tokens, dtype=torch.int64).to(dev)
