"""The target as a teacher: its next-token distribution at every training position, and the KL to it.

Self-distilled labels are the target's greedy choices, one token per position; its distribution
says far more (how sure it was, what came second), which is what a drafter's confidence gates
and top-k branches need. EAGLE-3 (SpecForge trains on the target's probabilities) and DART (its
annealed KL, Sec. 3.3) both learn from it.

The distribution needs no extra capture pass and no logit storage: every drafter kind captures
the input of layer ``L - 3`` (EAGLE-3's "high" feature), so :class:`TargetTail` runs the target's
last three layers, final norm and LM head on it, exactly the target's own forward from there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from sglang_echo.platform.packed_linear import pack_linears

from .batches import Batch


class TargetTail:
    """The target's layers ``first..L-1``, final norm and LM head rows of the draft vocabulary:
    the teacher distribution from the captured input of layer ``first``."""

    def __init__(self, target: Path, first_layer: int, draft_ids: Tensor, feature_slice: slice):
        from safetensors.torch import load_file
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
        pack_linears(model)  # frozen teacher: the CPU platform's packed GEMMs
        body = model.get_decoder()
        body.layers = body.layers[first_layer:]
        body.embed_tokens = None  # inputs_embeds only: drop the vocabulary-sized table
        self.body = body
        w = {}
        for f in sorted(Path(target).glob("*.safetensors")):
            w.update(load_file(str(f)))
        lm = w.get("lm_head.weight", w["model.embed_tokens.weight"]).float()
        self.lm_rows = lm[draft_ids].contiguous()  # [Vd, H]
        self.feature_slice = feature_slice
        for p in self.body.parameters():
            p.requires_grad_(False)

    @classmethod
    def for_features(cls, target: Path, captured_layers: Sequence[int], draft_ids: Tensor) -> TargetTail:
        """The tail above the deepest captured layer, reading its slice of the concatenated features."""
        H = json.loads((Path(target) / "config.json").read_text())["hidden_size"]
        n = len(captured_layers)
        return cls(target, captured_layers[-1], draft_ids, slice((n - 1) * H, n * H))

    @torch.no_grad()
    def __call__(self, batch: Batch) -> Tensor:
        """Log-probabilities over the draft vocabulary at every position, ``[B, T, Vd]``."""
        dev = batch.tokens.device
        if self.lm_rows.device != dev:  # follows the batches to the training device once
            self.body.to(dev)
            self.lm_rows = self.lm_rows.to(dev)
        T = batch.tokens.shape[1]
        mask = (torch.arange(T, device=dev)[None, :] < batch.lengths[:, None]).long()
        h = self.body(
            inputs_embeds=batch.features[..., self.feature_slice].float(), attention_mask=mask
        ).last_hidden_state
        return torch.log_softmax(h @ self.lm_rows.T, -1)


def kl_to_teacher(teacher_logp: Tensor, draft_logp: Tensor) -> Tensor:
    """Mean over rows of KL(teacher || draft); both ``[R, Vd]`` log-probabilities. Its gradient is
    the cross-entropy's with the teacher's distribution as a soft label."""
    return (teacher_logp.exp() * (teacher_logp - draft_logp)).sum(-1).mean()
