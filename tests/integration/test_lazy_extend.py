"""The lazy extend's backlog (integration.lazy_extend): pairs kept per request-pool slot, in order,
cleared by a prefill, bounded by its capacity. The catch-up itself runs in a real server:
tests/integration/test_echo_server.py::test_lazy_extend_drafts_as_eager_smollm2."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_echo.integration.lazy_extend import DraftBacklog, pool_slots


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
