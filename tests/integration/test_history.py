"""TokenHistory: the live requests' committed tokens, caught up incrementally (DART's n-gram context)."""

from __future__ import annotations

import random
from types import SimpleNamespace

from sglang_echo.integration.history import History, TokenHistory


def req(rid, prompt, output):
    return SimpleNamespace(rid=rid, origin_input_ids_unpadded=list(prompt), output_ids=list(output))


def check(th: TokenHistory, reqs) -> None:
    hist, lens = th.gather(reqs)
    want = [r.origin_input_ids_unpadded + r.output_ids for r in reqs]
    assert lens.tolist() == [len(w) for w in want]
    for b, w in enumerate(want):
        assert hist[b, : len(w)].tolist() == w


def test_history_view_and_extension() -> None:
    h = History([1, 2], [3], [4, 5])
    assert len(h) == 5 and h[-1] == 5 and h[2] == 3
    assert h.tail(1) == [2, 3, 4, 5] and h.tail(5) == []
    assert h.extends(0, -1) and h.extends(3, 3) and not h.extends(3, 9) and not h.extends(6, 5)


def test_random_batches_match_the_requests_tokens() -> None:
    """Requests join, grow by a few tokens a step, leave; rows and width grow past their first size."""
    rng = random.Random(0)
    th = TokenHistory("cpu", rows=2, width=4)
    live: dict[int, SimpleNamespace] = {}
    next_rid = 0
    for _ in range(60):
        for rid in [r for r in live if rng.random() < 0.1]:
            del live[rid]
        while len(live) < 5 and rng.random() < 0.7:
            live[next_rid] = req(next_rid, [rng.randrange(100) for _ in range(rng.randint(1, 9))], [])
            next_rid += 1
        for r in live.values():
            r.output_ids += [rng.randrange(100) for _ in range(rng.randint(0, 4))]
        batch = list(live.values())
        rng.shuffle(batch)
        check(th, batch)
        assert len(th) == len(batch)
    assert th.tokens.shape[0] >= 5 and th.tokens.shape[1] > 4 and th.rewrites == 0


def test_only_new_tokens_are_written() -> None:
    th = TokenHistory("cpu")
    a = req("a", [5, 6, 7], [8])
    check(th, [a])
    th.tokens[0, :4] = -1  # a step must not rewrite what the row already holds
    a.output_ids.append(9)
    hist, lens = th.gather([a])
    assert hist[0, : int(lens[0])].tolist() == [-1, -1, -1, -1, 9]


def test_rewritten_histories_and_reused_rows() -> None:
    th = TokenHistory("cpu", rows=1)
    a = req("a", [1, 2, 3], [4, 5])
    check(th, [a])
    a.output_ids = [4]  # retracted and re-run: shorter than what the row holds
    check(th, [a])
    a.output_ids = [7, 8]  # same length as held, different last token
    check(th, [a])
    assert th.rewrites == 2
    b = req("b", [9], [9, 9])  # "a" left the batch: its row is reused for "b"
    check(th, [b])
    assert th.tokens.shape[0] == 1
    check(th, [req("b", [3], [1])])  # a reused rid with another prompt
    assert th.rewrites == 3
    hist, lens = th.gather([])
    assert hist.shape[0] == 0 and lens.numel() == 0 and len(th) == 0
