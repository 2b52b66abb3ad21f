"""Inputs and checks shared by the control-kernel tests: random node pools of any size, and
poisoned allocations, so a cell a kernel never writes cannot pass for a right one."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import fields
from types import SimpleNamespace
from typing import Iterator

import pytest
import torch
from torch import Tensor

from sglang_echo.core.dense import DenseVerifyTensors
from sglang_echo.core.pack import PaddedTrees

POISON_INT = -777_777  # no slot, token, depth, position or link is ever this
POISON_BYTE = 0x5A  # neither False (0) nor True (1) as a bool's byte


def poison_(t: Tensor) -> Tensor:
    """Fill ``t`` in place with a value no kernel output takes (bools get a byte that is neither)."""
    if t.dtype == torch.bool or t.dtype == torch.uint8:
        t.view(torch.uint8).fill_(POISON_BYTE)
    elif t.is_floating_point():
        t.fill_(float("nan"))
    else:
        t.fill_(POISON_INT)
    return t


@contextmanager
def poisoned_empty(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every ``torch.empty`` called from Python (the kernels' outputs, a preallocated pool's
    columns) comes back poisoned: what a program leaves unwritten stays visibly wrong."""
    real = torch.empty
    with monkeypatch.context() as m:
        m.setattr(torch, "empty", lambda *a, **k: poison_(real(*a, **k)))
        yield


def same(a: Tensor, b: Tensor) -> bool:
    """Exact equality; bools compared as bytes, so a poisoned (unwritten) cell never matches."""
    if a.dtype == torch.bool or b.dtype == torch.bool:
        return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    return torch.equal(a, b)


def padded_buffers(B: int, W: int, device) -> PaddedTrees:
    empty = lambda *s, dtype=torch.int64: poison_(torch.empty(*s, dtype=dtype, device=device))  # noqa: E731
    return PaddedTrees(
        tokens=empty(B, W),
        parents=empty(B, W),
        depth=empty(B, W),
        positions=empty(B, W),
        mask=empty(B, W, W, dtype=torch.bool),
        valid=empty(B, W, dtype=torch.bool),
    )


def dense_buffers(B: int, W: int, device) -> DenseVerifyTensors:
    empty = lambda *s, dtype=torch.int64: poison_(torch.empty(*s, dtype=dtype, device=device))  # noqa: E731
    tree_mask = empty(B, W, W, dtype=torch.bool)
    return DenseVerifyTensors(
        draft_token=empty(B * W),
        positions=empty(B * W),
        custom_mask=tree_mask.view(-1),
        retrieve_index=empty(B, W),
        retrieve_next_token=empty(B, W),
        retrieve_next_sibling=empty(B, W),
        tree_mask=tree_mask,
        valid=empty(B, W, dtype=torch.bool),
        sizes=empty(B, dtype=torch.int32),
    )


def assert_same_fields(out, ref, cls) -> None:
    for f in fields(cls):
        assert same(getattr(out, f.name), getattr(ref, f.name)), f.name


def random_pool(batch: int, size: int, seed: int, device="cpu") -> SimpleNamespace:
    """A node pool as :class:`~sglang_echo.core.tree.NodePool` lays it out (the fields
    ``pad_pool`` reads): slot 0 the root, every other slot's parent an earlier slot, about 80 %
    valid and a kept set closed under parents (a tree); more kept slots than a width holds is
    allowed (``pad_pool`` keeps the first ``width``)."""
    g = torch.Generator().manual_seed(seed)
    B, P = batch, size
    parent = torch.full((B, P), -1, dtype=torch.int64)
    depth = torch.zeros(B, P, dtype=torch.int64)
    valid = torch.rand(B, P, generator=g) < 0.8
    valid[:, 0] = True
    coin = torch.rand(B, P, generator=g) < 0.7
    keep = torch.zeros(B, P, dtype=torch.bool)
    keep[:, 0] = True
    for p in range(1, P):  # a pool is at most a few hundred slots: a loop over them is fine here
        parent[:, p] = torch.randint(0, p, (B,), generator=g)
        up = parent[:, p : p + 1]
        depth[:, p] = depth.gather(1, up)[:, 0] + 1
        keep[:, p] = valid[:, p] & coin[:, p] & keep.gather(1, up)[:, 0]
    tokens = torch.randint(0, 3000, (B, P), generator=g)
    to = lambda t: t.to(device)  # noqa: E731
    return SimpleNamespace(
        batch_size=B, size=P, tokens=to(tokens), parent=to(parent), depth=to(depth), valid=to(valid), keep=to(keep)
    )
