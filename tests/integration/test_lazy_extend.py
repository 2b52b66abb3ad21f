"""The lazy extend's backlog (integration.lazy_extend): pairs kept per request-pool slot, in order,
cleared by a prefill, bounded by its capacity; a prefill's pairs deferred into it. The catch-up
itself runs in a real server: tests/integration/test_echo_server.py::test_lazy_extend_drafts_as_eager_smollm2."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_echo.integration.lazy_extend import DraftBacklog, defer_prefill, pool_slots


def test_pairs_append_per_slot_in_order_and_clear():
    b = DraftBacklog(num_slots=6, device="cpu", capacity=3)
    b.append([4, 1], torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([10, 11]))
    b.append([4], torch.tensor([[5.0, 6.0]]), torch.tensor([12]))
    assert b.pending([1, 4, 0]).tolist() == [1, 2, 0]
    assert b.tokens[4, :2].tolist() == [10, 12] and b.tokens[1, 0] == 11
    assert b.feats[4, 1].tolist() == [5.0, 6.0]
    b.clear([4])
    assert b.pending([1, 4]).tolist() == [1, 0]


def test_a_full_backlog_refuses_more():
    b = DraftBacklog(num_slots=2, device="cpu", capacity=2)
    for t in range(2):
        assert not b.full([0])
        b.append([0], torch.zeros(1, 4), torch.tensor([t]))
    assert b.full([0]) and not b.full([1])
    with pytest.raises(RuntimeError, match="backlog full"):
        b.append([0], torch.zeros(1, 4), torch.tensor([9]))


def test_pool_slots_prefer_the_host_copy():
    dev = torch.tensor([3, 5])
    assert pool_slots(SimpleNamespace(req_pool_indices=dev, req_pool_indices_cpu=torch.tensor([3, 5]))) == [3, 5]
    assert pool_slots(SimpleNamespace(req_pool_indices=dev, req_pool_indices_cpu=None)) == [3, 5]


def test_several_pairs_per_request_pack_after_the_pending_ones():
    b = DraftBacklog(num_slots=4, device="cpu", capacity=4)
    b.append([2], torch.tensor([[9.0]]), torch.tensor([90]))
    feats = torch.arange(5, dtype=torch.float32)[:, None]  # request 0 (slot 2): 2 pairs, request 1 (slot 0): 3
    b.extend([2, 0], torch.tensor([2, 3]), feats, torch.tensor([20, 21, 0, 1, 2]))
    assert b.pending([2, 0]).tolist() == [3, 3]
    assert b.tokens[2, :3].tolist() == [90, 20, 21] and b.tokens[0, :3].tolist() == [0, 1, 2]
    assert b.feats[2, :3, 0].tolist() == [9.0, 0.0, 1.0] and b.feats[0, :3, 0].tolist() == [2.0, 3.0, 4.0]
    assert b.fits([2, 0], torch.tensor([1, 1])) and not b.fits([2, 0], torch.tensor([2, 0]))


class _Worker:
    def __init__(self, capacity: int):
        self.echo_backlog = DraftBacklog(num_slots=4, device="cpu", capacity=capacity)
        self.deferred = 0

    def record_lazy(self, deferred: int = 0, caught_up: int = 0) -> None:
        self.deferred += deferred

    def placeholder_draft_input(self, bonus_tokens):
        return SimpleNamespace(bonus_tokens=bonus_tokens)


def _prefill(extend_lens, chunked_next=None, max_new=(1, 2)):
    ids = torch.arange(100, 100 + sum(extend_lens))
    return SimpleNamespace(
        input_ids=ids,
        extend_lens=extend_lens,
        reqs=[SimpleNamespace(sampling_params=SimpleNamespace(max_new_tokens=m)) for m in max_new],
        req_pool_indices=torch.tensor([3, 1][: len(extend_lens)]),
        req_pool_indices_cpu=None,
        chunked_req_next_prompt_token=chunked_next,
    )


def test_a_prefill_defers_its_pairs_with_the_sampled_token_last():
    """Pair p is (features at p, token at p + 1): the prompt shifted left, each request's last
    position followed by the token the prefill sampled, as sglang's eager prefill extend feeds it."""
    w, batch = _Worker(capacity=4), _prefill([3, 2])
    feats = torch.arange(5, dtype=torch.float32)[:, None]
    out = defer_prefill(w, batch, feats, torch.tensor([7, 8]), None)
    assert out.bonus_tokens.tolist() == [7, 8] and w.deferred == 5
    assert w.echo_backlog.pending([3, 1]).tolist() == [3, 2]
    assert w.echo_backlog.tokens[3, :3].tolist() == [101, 102, 7]
    assert w.echo_backlog.tokens[1, :2].tolist() == [104, 8]
    assert w.echo_backlog.feats[1, :2, 0].tolist() == [3.0, 4.0]


@pytest.mark.parametrize(
    "batch, mm",
    [
        (_prefill([3, 5]), None),  # 5 new tokens: beyond the backlog's 4
        (_prefill([3, 2], max_new=(1, 3)), None),  # 2 new tokens and a reply of up to 3: may not fit 4
        (_prefill([3, 2], max_new=(1, None)), None),  # a reply without a bound
        (_prefill([3, 2], chunked_next=42), None),  # a request between chunks
        (_prefill([3, 2]), torch.zeros(5, 2)),  # multimodal inputs
    ],
)
def test_a_prefill_that_cannot_wait_defers_nothing(batch, mm):
    w = _Worker(capacity=4)
    assert defer_prefill(w, batch, torch.zeros(sum(batch.extend_lens), 1), torch.tensor([7, 8]), mm) is None
    assert w.deferred == 0 and w.echo_backlog.pending([3, 1]).tolist() == [0, 0]
