"""Static buffers and token buckets so one CUDA graph per bucket serves any mix of tree sizes.

ECHO's verify batch changes shape every step (B requests, ragged ``K_i``), but a captured graph
replays fixed shapes and fixed pointers. We therefore capture one graph per **token bucket**:
the step's ``N = sum K_i`` real tokens are padded up to the smallest bucket ``>= N``, every
per-step array lives in a buffer allocated once at the largest capacity, and each bucket's graph
reads fixed-shape views of those buffers. The request count is fixed too: ``max_batch`` real
request slots (unused ones are empty: ``K = 0`` and no prefix) plus the padding requests below.

Bucket grid (:data:`DEFAULT_TOKEN_BUCKETS`): 16, 24, 32, 48, 64, 96, 128, ..., 3072, 4096, i.e.
steps alternating x1.5 and x1.33. Padding cost: the worst case is N just above a bucket, at most
+50% tokens (e.g. 65 -> 96); for N uniform in [17, 4096] the mean is +18% tokens and 14% of the
computed tokens are padding. Below 16 tokens everything shares the 16 bucket (the step is
latency-bound there, so the padded rows are free). Padded rows only add query rows, never
prefix reads, so attention cost grows less than the token count; the linear layers pay in full.

Padding tokens: they form extra requests of at most ``pad_chunk`` tokens (default 32) with no
prefix and an all-zero mask row, so each attends to nothing and outputs exactly 0 (no NaN), costs
one key tile, and cannot touch any real request (attention never crosses requests). Their
``tree_slots`` point at ``pad_slot`` (sglang's reserved slot 0 by default) so the model's K/V
write of padding tokens lands in a dummy slot, and their positions are 0.

All buffer filling in :meth:`TreeVerifyGraphBuffers.load` uses host values known without a sync
(tensor shapes) and device copies, so it can run either before replay or inside the graph.
:meth:`TreeVerifyGraphBuffers.load_tier` fills the same buffers for a forward that is already
laid out ``T`` lanes wide (sglang's ragged-verify graphs, :mod:`.ragged_tier`): its request count
comes from the tier and the runner's request slots, never from the step's ``N``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

from .metadata import TreeAttentionPlan, block_capacity, build_block_table
from .ragged_tier import RaggedTreeMetadata, tier_metadata

DEFAULT_TOKEN_BUCKETS: tuple[int, ...] = (
    16,
    24,
    32,
    48,
    64,
    96,
    128,
    192,
    256,
    384,
    512,
    768,
    1024,
    1536,
    2048,
    3072,
    4096,
)


def padding_cost(buckets: Sequence[int], lo: int = 17) -> tuple[float, float]:
    """(worst, mean) fraction of extra tokens over real ``N`` uniform in ``[lo, max bucket]``."""
    worst, total, count = 0.0, 0.0, 0
    for n in range(lo, max(buckets) + 1):
        extra = min(b for b in buckets if b >= n) / n - 1
        worst, total, count = max(worst, extra), total + extra, count + 1
    return worst, total / max(count, 1)


@dataclass
class BucketView:
    """Fixed-shape views of the buffers for one bucket: what a captured graph reads."""

    bucket: int
    qo_indptr: Tensor  # [R+1] int32, R = max_batch + pad requests of this bucket
    kv_indptr: Tensor  # [R+1] int32
    kv_indices: Tensor  # [kv_capacity] int32
    tree_slots: Tensor  # [bucket] int32
    packed_mask: Tensor  # [bucket, words] int32
    positions: Tensor  # [bucket] int64
    plan: TreeAttentionPlan
    workspace: Optional[tuple[Tensor, Tensor]]  # split-K partials when plan.num_splits > 1

    def args(self) -> tuple[Tensor, ...]:
        """The metadata arguments of the attention call, in contract order after the caches."""
        return self.qo_indptr, self.kv_indptr, self.kv_indices, self.tree_slots, self.packed_mask


class TreeVerifyGraphBuffers:
    """Preallocated per-step metadata for graph-captured tree-verify attention.

    ``max_batch`` real requests, trees of at most ``max_width`` nodes, ``kv_capacity`` prefix
    slots in total; ``num_heads``/``head_dim`` size the split-K workspace. ``num_splits`` maps a
    bucket to its split factor (fixed per graph); default 1 (no split).
    """

    def __init__(
        self,
        *,
        max_batch: int,
        max_width: int,
        kv_capacity: int,
        num_heads: int,
        head_dim: int,
        device: torch.device | str,
        buckets: Sequence[int] = DEFAULT_TOKEN_BUCKETS,
        block_m: int = 16,
        pad_chunk: int = 32,
        pad_slot: int = 0,
        num_splits: Optional[dict[int, int]] = None,
    ):
        self.buckets = tuple(sorted(buckets))
        self.max_batch, self.max_width, self.kv_capacity = max_batch, max_width, kv_capacity
        self.block_m, self.pad_chunk, self.pad_slot = block_m, pad_chunk, pad_slot
        self.device = torch.device(device)
        self.num_splits = {b: 1 for b in self.buckets} | dict(num_splits or {})
        self.words = max(1, -(-max_width // 32))
        top = self.buckets[-1]
        self.max_requests = self.requests_for(top)
        dev, i32 = self.device, torch.int32
        self.qo_indptr = torch.zeros(self.max_requests + 1, dtype=i32, device=dev)
        self.kv_indptr = torch.zeros(self.max_requests + 1, dtype=i32, device=dev)
        self.kv_indices = torch.zeros(max(kv_capacity, 1), dtype=i32, device=dev)
        self.tree_slots = torch.full((top,), pad_slot, dtype=i32, device=dev)
        self.packed_mask = torch.zeros(top, self.words, dtype=i32, device=dev)
        self.positions = torch.zeros(top, dtype=torch.int64, device=dev)
        cap = block_capacity(top, self.max_requests, block_m)
        self.block_req = torch.full((cap,), -1, dtype=i32, device=dev)
        self.block_start = torch.zeros(cap, dtype=i32, device=dev)
        max_splits = max(self.num_splits.values())
        self.workspace = None
        if max_splits > 1:
            self.workspace = (
                torch.empty(max_splits, top, num_heads, head_dim, dtype=torch.float32, device=dev),
                torch.empty(max_splits, top, num_heads, dtype=torch.float32, device=dev),
            )

    # ---- buckets ----------------------------------------------------------------------------
    def bucket_for(self, num_tokens: int) -> int:
        for b in self.buckets:
            if b >= num_tokens:
                return b
        raise ValueError(f"{num_tokens} verify tokens exceed the largest bucket {self.buckets[-1]}")

    def requests_for(self, bucket: int, slots: Optional[int] = None) -> int:
        """Request slots of a bucket's graph: real ones (``max_batch``, or ``slots``) plus room for
        all-padding steps."""
        return (self.max_batch if slots is None else slots) + -(-bucket // self.pad_chunk)

    def view(self, bucket: int, slots: Optional[int] = None) -> BucketView:
        if slots is not None and slots > self.max_batch:
            raise ValueError(f"{slots} request slots exceed max_batch {self.max_batch}")
        if bucket > self.buckets[-1]:
            raise ValueError(f"tier {bucket} exceeds the largest bucket {self.buckets[-1]}")
        r = self.requests_for(bucket, slots)
        cap = block_capacity(bucket, r, self.block_m)
        splits = self.num_splits.get(bucket, 1)
        ws = None
        if splits > 1 and self.workspace is not None:
            ws = (self.workspace[0][:splits, :bucket], self.workspace[1][:splits, :bucket])
        return BucketView(
            bucket=bucket,
            qo_indptr=self.qo_indptr[: r + 1],
            kv_indptr=self.kv_indptr[: r + 1],
            kv_indices=self.kv_indices,
            tree_slots=self.tree_slots[:bucket],
            packed_mask=self.packed_mask[:bucket],
            positions=self.positions[:bucket],
            plan=TreeAttentionPlan(self.block_req[:cap], self.block_start[:cap], self.block_m, splits),
            workspace=ws,
        )

    # ---- per step -----------------------------------------------------------------------------
    def load(
        self,
        qo_indptr: Tensor,
        kv_indptr: Tensor,
        kv_indices: Tensor,
        tree_slots: Tensor,
        packed_mask: Tensor,
        positions: Tensor,
    ) -> BucketView:
        """Copy one step's metadata into the buffers, pad it to its bucket, return the view.

        Host values used: ``B = qo_indptr.numel() - 1``, ``N = tree_slots.numel()``,
        ``kv_indices.numel()`` and the mask width; no device sync. The caller copies ``q`` (and
        the model's inputs) into its own static buffers padded the same way.
        """
        b, n = qo_indptr.numel() - 1, tree_slots.numel()
        if b > self.max_batch:
            raise ValueError(f"batch {b} exceeds max_batch {self.max_batch}")
        if kv_indices.numel() > self.kv_capacity:
            raise ValueError(f"{kv_indices.numel()} prefix slots exceed kv_capacity {self.kv_capacity}")
        if packed_mask.shape[1] > self.words:
            raise ValueError(f"mask has {packed_mask.shape[1]} words, buffers hold {self.words}")
        bucket = self.bucket_for(n)
        v = self.view(bucket)
        r = v.qo_indptr.numel() - 1
        dev = self.device

        # Requests: real ones, then padding requests of <= pad_chunk tokens, then empty ones.
        v.qo_indptr[: b + 1].copy_(qo_indptr)
        pad_req = torch.arange(1, r - b + 1, device=dev, dtype=torch.int64)
        v.qo_indptr[b + 1 :].copy_((n + pad_req * self.pad_chunk).clamp(max=bucket))
        v.kv_indptr[: b + 1].copy_(kv_indptr)
        v.kv_indptr[b + 1 :].copy_(kv_indptr[b:].expand(r - b))  # no prefix for padding
        v.kv_indices[: kv_indices.numel()].copy_(kv_indices)

        v.tree_slots[:n].copy_(tree_slots)
        v.tree_slots[n:].fill_(self.pad_slot)
        w = packed_mask.shape[1]
        v.packed_mask[:n, :w].copy_(packed_mask)
        v.packed_mask[:n, w:].zero_()
        v.packed_mask[n:].zero_()  # padding rows see nothing -> output 0
        v.positions[:n].copy_(positions)
        v.positions[n:].zero_()
        build_block_table(v.qo_indptr, bucket, self.block_m, out=(v.plan.block_req, v.plan.block_start))
        return v

    def load_tier(
        self, tier: int, slots: int, lens: Tensor, width: int, tree_rows: Optional[Tensor], kv_indices: Tensor
    ) -> RaggedTreeMetadata:
        """One compact forward's metadata in the static views of ``(tier, slots)`` (see
        :func:`.ragged_tier.tier_metadata`); sync-free, so it can run before every replay.

        The caller fills ``self.view(tier, slots).kv_indptr[:slots + 1]`` (the request slots'
        prefix offsets) first; ``kv_indices`` are read through it, not copied."""
        if -(-width // 32) > self.words:
            raise ValueError(f"trees {width} wide exceed the buffers' {self.max_width}")
        v = self.view(tier, slots)
        return tier_metadata(
            lens,
            width,
            tier,
            slots,
            tree_rows,
            v.kv_indptr,
            kv_indices,
            block_m=self.block_m,
            pad_chunk=self.pad_chunk,
            num_splits=v.plan.num_splits,
            qo_indptr=v.qo_indptr,
            packed_mask=v.packed_mask,
            blocks=(v.plan.block_req, v.plan.block_start),
        )
