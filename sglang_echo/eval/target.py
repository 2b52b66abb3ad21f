"""An HF transformers causal LM as the target of the offline speculative loop.

State per request ``b`` (the gpt-fast / EAGLE convention)::

    committed tokens  = prompt + generated
    KV cache          = every committed token except the last one (``lens[b]`` entries)
    last committed    = the root of the next tree; it is NOT in the KV cache yet

so every verification pass computes the root's own KV together with its tree. The cache is one
HF ``DynamicCache`` whose layers hold ``[B, H_kv, S, D]`` tensors, right-padded: request ``b``
owns columns ``0 .. lens[b]-1`` and everything past them is garbage that the attention mask
hides (``S = max(lens)``). Keys are stored post-RoPE, so each entry keeps the position it was
computed at regardless of the padding.

* :meth:`HFTarget.prefill`: the whole prompt (right padding, causal mask per request); returns
  the first generated token and the prompt features. After it ``lens[b] = len(prompt_b)``.
* :meth:`HFTarget.verify`: one forward over every request's tree, padded to ``[B, W]`` (W = the
  widest tree). Node ``j`` of request ``b`` sits at position ``lens[b] + depth_j`` and attends to
  columns ``< lens[b]`` of the cache plus its tree ancestors and itself (a custom 4D additive
  mask, which HF passes through as-is). The pass appends ``W`` columns to the cache.
* :meth:`HFTarget.commit`: keeps, per request, the KV of its accepted path (root first) and drops
  the rest. One ``gather`` along the sequence axis per layer rebuilds the cache: column ``j`` of
  request ``b`` comes from ``j`` (``j < lens[b]``: already committed) or from the verify column
  ``S + local index of the (j - lens[b])-th accepted node``; the bonus token is the new last
  committed token and stays out of the cache. Requests marked inactive keep their state.

Features are the *input* residual stream of the ``captured_layers`` (HF ``hidden_states[i]``;
``i == num_layers`` is the last layer's output before the final norm), captured by forward
pre-hooks, concatenated in order.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import Tensor

from sglang_echo.core.pack import pad_trees
from sglang_echo.core.tree import DraftTrees
from sglang_echo.core.verify import VerifyResult
from sglang_echo.platform.packed_linear import pack_linears


class HFTarget:
    """A Llama-like ``*ForCausalLM`` (``model.base_model`` has ``layers`` and ``norm``)."""

    def __init__(self, model: torch.nn.Module, captured_layers: Sequence[int] = ()):
        self.model = model.eval()
        pack_linears(model)  # on the CPU: the platform's packed GEMMs, as the CPU server runs them
        self.base = model.base_model
        self.lm_head = model.get_output_embeddings()
        self.config = model.config
        layers = self.base.layers
        self.num_layers = len(layers)
        self.captured_layers = tuple(int(i) for i in captured_layers)
        bad = [i for i in self.captured_layers if not 0 <= i <= self.num_layers]
        if bad:
            raise ValueError(f"captured layers {bad} outside 0..{self.num_layers}")
        self._caps: dict[int, Tensor] = {}
        self._hooks = []
        for i in sorted(set(self.captured_layers)):
            module = layers[i] if i < self.num_layers else self.base.norm
            self._hooks.append(module.register_forward_pre_hook(self._capture(i), with_kwargs=True))
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.cache = None
        self.lens: Optional[Tensor] = None  # [B] KV entries per request
        self._pending: Optional[tuple[int, Tensor, Tensor]] = None

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        captured_layers: Sequence[int] = (),
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        attn_implementation: str = "sdpa",
    ) -> "HFTarget":
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation=attn_implementation)
        return cls(model.to(device), captured_layers)

    @property
    def feature_dim(self) -> int:
        return len(self.captured_layers) * self.config.hidden_size

    @property
    def input_embedding(self) -> Tensor:
        return self.model.get_input_embeddings().weight

    def _capture(self, i: int):
        def hook(module, args, kwargs):
            self._caps[i] = args[0] if args else kwargs["hidden_states"]

        return hook

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    # -- the forward -----------------------------------------------------------------------------
    def _forward(self, ids: Tensor, positions: Tensor, allowed: Tensor) -> tuple[Tensor, Optional[Tensor]]:
        """ids/positions ``[B, Q]``, allowed ``[B, Q, K]`` (K = cached + Q) -> (hidden, features)."""
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        self._caps.clear()
        out = self.base(
            input_ids=ids,
            position_ids=positions,
            attention_mask=mask[:, None],
            past_key_values=self.cache,
            use_cache=True,
        )
        feats = torch.cat([self._caps[i] for i in self.captured_layers], -1) if self.captured_layers else None
        self._caps.clear()
        return out.last_hidden_state, feats

    def _cache_layers(self) -> list:
        return list(self.cache.layers)

    def cache_len(self) -> int:
        return self.cache.get_seq_length() if self.cache is not None else 0

    # -- the three steps -----------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, prompts: Sequence[Tensor]) -> tuple[Tensor, Optional[list[Tensor]]]:
        """Encode a new batch; returns the greedy first token ``[B]`` and the prompt features
        (``features[b]``: ``[len(prompt_b), n * H]``; None without captured layers)."""
        from transformers import DynamicCache

        toks = [torch.as_tensor(p, dtype=torch.long).reshape(-1) for p in prompts]
        if not toks or min(t.numel() for t in toks) < 1:
            raise ValueError("prefill needs at least one prompt, each of at least one token")
        B, dev = len(toks), self.device
        lens = torch.tensor([t.numel() for t in toks], device=dev)
        L = int(lens.max())
        ids = torch.zeros(B, L, dtype=torch.long, device=dev)
        for b, t in enumerate(toks):
            ids[b, : t.numel()] = t.to(dev)
        ar = torch.arange(L, device=dev)
        causal = ar[None, :] <= ar[:, None]  # [Q, K]
        key_ok = ar[None, :] < lens[:, None]  # [B, K]
        allowed = (causal[None] & key_ok[:, None, :]) | torch.eye(L, dtype=torch.bool, device=dev)[None]
        self.cache = DynamicCache(config=self.config)
        self._pending = None
        hidden, feats = self._forward(ids, ar.expand(B, L), allowed)
        last = hidden[torch.arange(B, device=dev), lens - 1]
        first = self.lm_head(last).argmax(-1)
        self.lens = lens
        if feats is None:
            return first, None
        return first, [feats[b, : int(n)] for b, n in enumerate(lens.tolist())]

    @torch.inference_mode()
    def verify(self, trees: DraftTrees) -> tuple[Tensor, Optional[Tensor]]:
        """Score every node of every tree in one pass: logits ``[N, V]`` (the target's distribution
        of the token after each node) and features ``[N, n * H]`` (None without captured layers),
        both in the CSR order of ``trees``. Must be followed by :meth:`commit`."""
        if self.lens is None:
            raise RuntimeError("verify before prefill")
        if self._pending is not None:
            raise RuntimeError("verify called twice without a commit in between")
        if trees.batch_size != self.lens.numel():
            raise ValueError(f"{trees.batch_size} trees for a batch of {self.lens.numel()}")
        trees = _to(trees, self.device)
        padded = pad_trees(trees, self.lens)
        B, W = padded.valid.shape
        S = self.cache_len()
        dev = self.device
        prefix_ok = torch.arange(S, device=dev)[None, :] < self.lens[:, None]  # [B, S]
        tree_ok = padded.mask | torch.eye(W, dtype=torch.bool, device=dev)[None]  # padding slots see themselves
        allowed = torch.cat([prefix_ok[:, None, :].expand(B, W, S), tree_ok], -1)
        hidden, feats = self._forward(padded.tokens, padded.positions, allowed)
        valid = padded.valid
        logits = self.lm_head(hidden[valid])
        self._pending = (S, trees.indptr, valid)
        return logits, (feats[valid] if feats is not None else None)

    @torch.inference_mode()
    def commit(self, result: VerifyResult, active: Optional[Tensor] = None) -> None:
        """Keep the KV of each request's accepted path (root first); drop every other tree node.
        Requests with ``active[b] == False`` commit nothing (their state stays as it was)."""
        if self._pending is None:
            raise RuntimeError("commit without a verify")
        S, indptr, _ = self._pending
        dev = self.device
        lens = self.lens
        n_keep = result.accept_len.to(dev) + 1
        if active is not None:
            n_keep = torch.where(active.to(dev), n_keep, torch.zeros_like(n_keep))
        new_lens = lens + n_keep
        S2 = int(new_lens.max())
        path = result.accepted_nodes.to(dev)  # [B, D+1] global node indices, -1 pad
        local = torch.where(path >= 0, path - indptr[:-1, None], torch.zeros_like(path))
        j = torch.arange(S2, device=dev)[None, :]
        k = j - lens[:, None]  # index into the accepted path
        in_new = (k >= 0) & (k < n_keep[:, None])
        from_tree = S + local.gather(1, k.clamp(0, path.shape[1] - 1))
        idx = torch.where(j < lens[:, None], j, torch.where(in_new, from_tree, torch.zeros_like(j)))
        for layer in self._cache_layers():
            Bk, Hkv, _, D = layer.keys.shape
            g = idx[:, None, :, None].expand(Bk, Hkv, S2, D)
            layer.keys = layer.keys.gather(2, g)
            layer.values = layer.values.gather(2, g)
        self.lens = new_lens
        self._pending = None


def _to(trees: DraftTrees, device: torch.device) -> DraftTrees:
    if trees.tokens.device == device:
        return trees
    moved = {
        name: getattr(trees, name).to(device)
        for name in ("indptr", "tokens", "parents", "depth", "logprob", "path_score", "drafter", "proposal")
    }
    return replace(trees, **moved)
