"""DART's n-gram model: a compact token trie in safetensors, plus each request's own n-grams.

DART prunes its draft tree with an n-gram "continuity" score (Sec. 4.2, App. C): for a candidate
token ``t`` after a context, ``Pr(t | context)`` from a 3-gram trie built with the target's tokenizer.
We follow fvliang/DART's ``TrieNgram::get_probability``: try the longest context first (``order - 1``
tokens, then shorter), and take the first length at which ``t`` was seen after that context::

    Pr(t | c) = count(c t) / count(c)          (no discount, no unigram fallback; unseen -> 0)

where ``count`` is the number of occurrences of an n-gram in the corpus.

File. The trie is stored level by level: level ``n`` holds the corpus' distinct n-grams as sorted
int64 keys (``key = sum_i tok_i * V^(n-1-i)``, i.e. lexicographic order, so the children of a
level-``n-1`` node are one contiguous run of level ``n``) and their counts::

    keys.1 .. keys.N    int64 [M_n]  strictly increasing
    counts.1 .. counts.N int32 [M_n] (> 0)
    metadata: format=sglang-echo-ngram-trie, version, order, vocab_size, tokenizer, tokens, ...

No pickle; a lookup is a binary search (``torch.searchsorted``) vectorised over every candidate of
every request at once, instead of DART's per-node C++ hash maps.

Request-local n-grams. Each request's committed tokens (prompt + output) form a second, tiny
count table (:class:`LocalNGrams`, rebuilt from the history when it changes). The two are combined
as pseudo-counts, ``count = count_corpus + local_weight * count_request``, before the ratio, so a
context seen in the request (code being copied, a repeated name) is scored even when the corpus
never saw it.

A trie is built from a corpus with ``echo-build-ngram`` (:mod:`sglang_echo.training.ngram_cli`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

FORMAT = "sglang-echo-ngram-trie"
VERSION = "1"
INT64_MAX = torch.iinfo(torch.int64).max


class NGramTrieError(ValueError):
    """A trie file or corpus that cannot be used (the message says why and where)."""


def max_order(vocab_size: int) -> int:
    """The longest n-gram whose key fits an int64 for this vocabulary."""
    n = 0
    while vocab_size ** (n + 1) <= INT64_MAX:
        n += 1
    return n


def encode(grams: Tensor, vocab_size: int) -> Tensor:
    """n-gram keys: ``grams [..., n]`` token ids -> ``[...]`` int64 (lexicographic order)."""
    n = grams.shape[-1]
    key = torch.zeros(grams.shape[:-1], dtype=torch.int64, device=grams.device)
    for i in range(n):  # Horner: n <= order (3 by default), not a hot loop over tokens
        key = key * vocab_size + grams[..., i].long()
    return key


def sequence_keys(seq: Tensor, n: int, vocab_size: int) -> Tensor:
    """Keys of every n-gram of one token sequence."""
    seq = seq.reshape(-1).long()
    if seq.numel() < n:
        return torch.zeros(0, dtype=torch.int64)
    return encode(seq.unfold(0, n, 1), vocab_size)


def _merge(keys: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
    uniq, inv = torch.unique(keys, sorted=True, return_inverse=True)
    return uniq, torch.zeros(uniq.numel(), dtype=torch.int64).scatter_add_(0, inv, counts)


def _count_sorted(sorted_keys: Tensor, counts: Tensor | None, query: Tensor) -> Tensor:
    """Counts of ``query`` keys in a sorted key array (0 where absent); vectorised."""
    if sorted_keys.numel() == 0:
        return torch.zeros(query.shape, dtype=torch.int64, device=query.device)
    flat = query.reshape(-1)
    idx = torch.searchsorted(sorted_keys, flat).clamp(max=sorted_keys.numel() - 1)
    hit = sorted_keys[idx] == flat
    c = counts[idx].long() if counts is not None else torch.ones_like(idx)
    return torch.where(hit, c, torch.zeros_like(c)).reshape(query.shape)


@dataclass
class NGramTrie:
    order: int
    vocab_size: int
    keys: list[Tensor]  # keys[n - 1]: sorted distinct n-gram keys
    counts: list[Tensor]  # counts[n - 1]: their corpus counts
    meta: dict = field(default_factory=dict)

    # -- building -----------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        sequences: Iterable[Tensor],
        vocab_size: int,
        order: int = 3,
        min_count: int = 1,
        flush_every: int = 4_000_000,
        meta: dict | None = None,
    ) -> NGramTrie:
        """Count every n-gram (n = 1..order) of ``sequences`` (token id tensors)."""
        if not 1 <= order <= max_order(vocab_size):
            raise NGramTrieError(
                f"order must be in 1..{max_order(vocab_size)} for a {vocab_size}-token vocabulary, got {order}"
            )
        run_k = [torch.zeros(0, dtype=torch.int64) for _ in range(order)]
        run_c = [torch.zeros(0, dtype=torch.int64) for _ in range(order)]
        pend: list[list[Tensor]] = [[] for _ in range(order)]
        pending = n_seq = n_tok = 0

        def flush() -> None:
            for i in range(order):
                if pend[i]:
                    k = torch.cat(pend[i])
                    run_k[i], run_c[i] = _merge(torch.cat([run_k[i], k]), torch.cat([run_c[i], torch.ones_like(k)]))
                    pend[i] = []

        for seq in sequences:
            seq = torch.as_tensor(seq).reshape(-1).long()
            if seq.numel() == 0:
                continue
            lo, hi = int(seq.min()), int(seq.max())
            if lo < 0 or hi >= vocab_size:
                raise NGramTrieError(
                    f"sequence {n_seq} has token ids in [{lo}, {hi}], outside the vocabulary 0..{vocab_size - 1}"
                )
            for i in range(order):
                pend[i].append(sequence_keys(seq, i + 1, vocab_size))
            n_seq, n_tok, pending = n_seq + 1, n_tok + seq.numel(), pending + seq.numel() * order
            if pending >= flush_every:
                flush()
                pending = 0
        flush()
        if n_tok == 0:
            raise NGramTrieError("the corpus has no tokens")
        if min_count > 1:  # prune rare n-grams (n >= 2); unigrams keep the context counts exact
            for i in range(1, order):
                keep = run_c[i] >= min_count
                run_k[i], run_c[i] = run_k[i][keep], run_c[i][keep]
        info = {"sequences": n_seq, "tokens": n_tok, "min_count": min_count, **(meta or {})}
        return cls(order, vocab_size, run_k, run_c, info)

    # -- lookups --------------------------------------------------------------------------------
    def count(self, n: int, keys: Tensor) -> Tensor:
        """Corpus count of each n-gram key (``[...]`` -> ``[...]``, 0 where unseen)."""
        return _count_sorted(self.keys[n - 1], self.counts[n - 1], keys)

    def to(self, device: torch.device | str) -> NGramTrie:
        return NGramTrie(
            self.order,
            self.vocab_size,
            [k.to(device) for k in self.keys],
            [c.to(device) for c in self.counts],
            dict(self.meta),
        )

    @property
    def num_nodes(self) -> int:
        return sum(k.numel() for k in self.keys)

    # -- files ----------------------------------------------------------------------------------
    def save(self, path: Path) -> None:
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for n in range(1, self.order + 1):
            c = self.counts[n - 1]
            tensors[f"keys.{n}"] = self.keys[n - 1].cpu().contiguous()
            tensors[f"counts.{n}"] = (
                (c.to(torch.int32) if c.numel() == 0 or int(c.max()) < 2**31 else c).cpu().contiguous()
            )
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "order": str(self.order),
            "vocab_size": str(self.vocab_size),
            **{k: str(v) for k, v in self.meta.items()},
        }
        tmp = path.with_name(path.name + ".tmp")
        save_file(tensors, str(tmp), metadata=meta)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path, vocab_size: int | None = None) -> NGramTrie:
        """Load and validate a trie file; ``vocab_size``: the target's, checked against the file's."""
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise NGramTrieError(f"{path}: no such n-gram trie file")
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = dict(f.metadata() or {})
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as e:  # noqa: BLE001 - any parse failure is a bad file
            raise NGramTrieError(f"{path}: not a safetensors n-gram trie ({type(e).__name__}: {e})") from None
        if meta.get("format") != FORMAT:
            raise NGramTrieError(
                f"{path}: not an sglang-echo n-gram trie (metadata format={meta.get('format')!r}; "
                f"build one with echo-build-ngram)"
            )
        if meta.get("version") != VERSION:
            raise NGramTrieError(f"{path}: trie format version {meta.get('version')!r}, this code reads {VERSION!r}")
        try:
            order, V = int(meta["order"]), int(meta["vocab_size"])
        except (KeyError, ValueError):
            raise NGramTrieError(f"{path}: metadata lacks a valid order/vocab_size: {meta}") from None
        if vocab_size is not None and V != vocab_size:
            raise NGramTrieError(
                f"{path}: built for a {V}-token vocabulary, the target has {vocab_size} "
                f"(tokenizer {meta.get('tokenizer', '?')}); rebuild it with the target's tokenizer"
            )
        if not 1 <= order <= max_order(V):
            raise NGramTrieError(f"{path}: order {order} is invalid for a {V}-token vocabulary")
        keys, counts = [], []
        for n in range(1, order + 1):
            k, c = tensors.get(f"keys.{n}"), tensors.get(f"counts.{n}")
            if k is None or c is None:
                raise NGramTrieError(f"{path}: missing keys.{n}/counts.{n} (order {order})")
            if k.dtype != torch.int64 or k.dim() != 1 or c.dim() != 1 or c.shape != k.shape or c.is_floating_point():
                raise NGramTrieError(
                    f"{path}: level {n} arrays are malformed (keys {k.dtype} {tuple(k.shape)}, "
                    f"counts {c.dtype} {tuple(c.shape)})"
                )
            if k.numel() and (bool((k[1:] <= k[:-1]).any()) or int(k[0]) < 0 or int(k[-1]) >= V**n):
                raise NGramTrieError(
                    f"{path}: level {n} keys are not sorted, distinct n-grams of a {V}-token vocabulary"
                )
            if c.numel() and int(c.min()) <= 0:
                raise NGramTrieError(f"{path}: level {n} has non-positive counts")
            keys.append(k)
            counts.append(c)
        info = {k: v for k, v in meta.items() if k not in ("format", "version", "order", "vocab_size")}
        return cls(order, V, keys, counts, info)


class LocalNGrams:
    """Every request's own n-gram counts over its committed tokens, sorted per row (``[B, L]``)."""

    def __init__(self, history: Tensor, lengths: Tensor, order: int, vocab_size: int):
        B, L = history.shape
        self.sorted: list[Tensor] = []
        pos = torch.arange(L, device=history.device)
        hist = history.clamp(min=0).long()
        for n in range(1, order + 1):
            if L >= n:
                keys = encode(hist.unfold(1, n, 1), vocab_size)  # [B, L - n + 1]
                real = pos[None, : L - n + 1] + n <= lengths[:, None]
                keys = torch.where(real, keys, torch.full_like(keys, INT64_MAX))
            else:
                keys = torch.full((B, 1), INT64_MAX, dtype=torch.int64, device=history.device)
            self.sorted.append(keys.sort(dim=1).values)

    def count(self, n: int, keys: Tensor) -> Tensor:
        """``keys [B, ...]`` -> occurrences of each n-gram in its own request, ``[B, ...]``."""
        s = self.sorted[n - 1]
        q = keys.reshape(keys.shape[0], -1).contiguous()
        c = torch.searchsorted(s, q, right=True) - torch.searchsorted(s, q)
        return c.reshape(keys.shape)


def continuation_prob(
    context: Tensor,
    tokens: Tensor,
    order: int,
    vocab_size: int,
    trie: NGramTrie | None = None,
    local: LocalNGrams | None = None,
    local_weight: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """DART's ``Pr(t | context)`` with longest-context back-off, vectorised.

    ``context [B, Q, order-1]`` (most recent last; ``-1`` = before the start), ``tokens [B, Q]`` ->
    (probability ``[B, Q]``, matched context length ``[B, Q]``, 0 = unseen).
    """
    prob = torch.zeros(tokens.shape, dtype=torch.float32, device=tokens.device)
    matched = torch.zeros(tokens.shape, dtype=torch.int64, device=tokens.device)

    def counts(n: int, keys: Tensor) -> Tensor:
        c = torch.zeros(keys.shape, dtype=torch.float32, device=keys.device)
        if trie is not None:
            c = c + trie.count(n, keys).float()
        if local is not None and local_weight > 0:
            c = c + local_weight * local.count(n, keys).float()
        return c

    for L in range(order - 1, 0, -1):
        ctx = context[..., context.shape[-1] - L :]
        ok = (ctx >= 0).all(-1)
        ctx = ctx.clamp(min=0)
        child = counts(L + 1, encode(torch.cat([ctx, tokens[..., None]], -1), vocab_size))
        hit = ok & (child > 0) & (matched == 0)
        if bool(hit.any()):
            denom = counts(L, encode(ctx, vocab_size))
            prob = torch.where(hit, child / denom.clamp(min=1e-12), prob)
            matched = torch.where(hit, torch.full_like(matched, L), matched)
    return prob, matched
