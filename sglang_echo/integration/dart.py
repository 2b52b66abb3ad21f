"""``drafter: dart``: the DART drafter inside sglang, on EAGLE's draft plumbing.

DART's prefix is EAGLE-3's: pair ``t`` = ``(fc(h_t), x_{t+1})`` at rotary position ``t`` through
the same single layer (:mod:`sglang_echo.drafters.dart_head`). So sglang's EAGLE machinery runs it
unchanged: the target captures the low/mid/high features, and ``EAGLEWorkerV2``'s draft extend
writes every accepted pair into the draft KV pool and computes the last pair's logits, whose top-k
(``spec_info.topk_p``/``topk_index``) is DART's marginal of depth 1. What DART adds is the
``d - 1`` mask positions, which no sglang forward has:

* :class:`LlamaForCausalLMDart` is sglang's ``LlamaForCausalLMEagle3`` plus ``midlayer.mask_rep``,
  registered in sglang's model registry under DART's architecture name so ``--speculative-draft-
  model-path`` loads a DART head directory (``config.json`` ``architectures =
  ["LlamaForCausalLMDart"]``). :meth:`LlamaForCausalLMDart.mask_logits` is DART's one forward
  over the masks: they attend to the request's committed draft KV (read from sglang's pool through
  ``req_to_token``) and causally to each other. Their own K/V live only inside that forward (a mask
  position is never committed), so nothing is written to the pool and nothing must be freed.
* :class:`DartFrontierDrafter` is the core's drafter protocol over one step: marginal 1 from the
  draft extend, marginals ``2..d`` from :meth:`mask_logits`, and the tree search of
  :class:`~sglang_echo.drafters.dart_search.DartSearch` (DART's COMBINE ranking with the n-gram trie and
  the request's own n-grams, read from a :class:`~.history.TokenHistory` that each step extends
  by the tokens just committed). Any core policy builds the trees from it; sglang verifies them as
  it does EAGLE's (:mod:`.draft_worker`).
* :class:`DartDrafting` is DART's step strategy (:mod:`.drafting`): it registers the model class
  before sglang loads the head, checks what loaded and owns the step's search and the history;
  the rest of the step (the draft extends, the LM head, CUDA graphs) is sglang's EAGLE plumbing.

Because the depth-1 candidates come from the draft extend's top-k, a policy can ask for at most
``--speculative-eagle-topk`` children of a root (the same bound as the EAGLE-3 drafter); deeper
levels rank DART's top-25 per position. DART's static Algorithm 1 tree (``dart-tree``) is an
offline policy (``echo-bench acceptance``), not a server one.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3
from torch import Tensor, nn

from sglang_echo.core.policy import Frontier
from sglang_echo.core.tree import Candidates
from sglang_echo.drafters.dart import load_head_trie
from sglang_echo.drafters.dart_head import ARCHITECTURE, MASK_KEY
from sglang_echo.drafters.dart_search import CombineConfig, DartSearch
from sglang_echo.platform.attention.paged_sdpa import gather_rows

from .config import Drafter
from .drafter import draft_extend_topk
from .drafting import StepDrafter
from .history import TokenHistory

log = logging.getLogger(__name__)


class LlamaForCausalLMDart(LlamaForCausalLMEagle3):
    """sglang's EAGLE-3 draft model plus DART's mask representation (see the module docstring)."""

    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__(config, quant_config=quant_config, prefix=prefix)
        if getattr(config, "draft_length", None) is None:
            raise ValueError("DART config.json has no draft_length (the number of mask positions)")
        self.num_masks = int(config.draft_length)
        shared = getattr(config, "dart_mask_embeddings", "shared") == "shared"
        # Replaced by the checkpoint's tensor in load_weights ([2H] shared or [d-1, 2H]).
        self.mask_rep = nn.Parameter(
            torch.zeros(1 if shared else self.num_masks, 2 * config.hidden_size), requires_grad=False
        )

    def load_weights(self, weights) -> None:
        rest = []
        for name, w in weights:
            if name.endswith(MASK_KEY):
                rep = w.reshape(-1, self.mask_rep.shape[-1])
                if rep.shape[0] not in (1, self.num_masks):
                    raise ValueError(
                        f"DART checkpoint: {MASK_KEY} {tuple(w.shape)} fits neither one shared mask "
                        f"nor draft_length={self.num_masks} masks"
                    )
                self.mask_rep = nn.Parameter(rep.to(self.mask_rep.device, self.mask_rep.dtype), requires_grad=False)
            else:
                rest.append((name, w))
        super().load_weights(rest)

    @torch.no_grad()
    def mask_logits(self, seq_lens: Tensor, prefix_slots: Tensor, k_buffer: Tensor, v_buffer: Tensor) -> Tensor:
        """DART's mask forward: ``[B, d-1, Vd]`` draft-vocab logits of depths ``2..d``.

        ``seq_lens [B]``: committed draft pairs (positions ``0..P-1``; mask ``j`` sits at ``P + j``);
        ``prefix_slots [B, L]``: their KV-pool slots (``req_to_token`` rows, ``L >= max P``);
        ``k_buffer, v_buffer [slots, kv_heads, D]``: the draft layer's KV pool.
        """
        if k_buffer.element_size() == 1:  # fp8 KV caches store scaled values; mask_logits reads them raw
            raise NotImplementedError("ECHO's DART drafter does not read an fp8 draft KV cache yet")
        layer = self.model.layers[0]
        attn = layer.self_attn
        B, m, H = seq_lens.numel(), self.num_masks, self.config.hidden_size
        L = prefix_slots.shape[1]
        rep = self.mask_rep.expand(m, -1) if self.mask_rep.shape[0] == 1 else self.mask_rep  # [m, 2H]
        x = rep[None].expand(B, m, -1).reshape(B * m, -1)
        positions = (seq_lens.long()[:, None] + torch.arange(m, device=seq_lens.device)).reshape(-1)
        qkv, _ = attn.qkv_proj(x)
        q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        q, k = attn.rotary_emb(positions, q, k)
        D = attn.head_dim

        def heads(t: Tensor, n: int) -> Tensor:
            return t.reshape(B, m, n, D).transpose(1, 2)

        kp = gather_rows(k_buffer, prefix_slots).to(q.dtype).transpose(1, 2)  # [B, kvh, L, D]
        vp = gather_rows(v_buffer, prefix_slots).to(q.dtype).transpose(1, 2)
        keys = torch.cat([kp, heads(k, attn.num_kv_heads)], 2)
        values = torch.cat([vp, heads(v, attn.num_kv_heads)], 2)
        committed = torch.arange(L, device=seq_lens.device)[None, :] < seq_lens[:, None]  # [B, L]
        causal = torch.ones(m, m, dtype=torch.bool, device=seq_lens.device).tril()
        mask = torch.cat([committed[:, None, :].expand(B, m, L), causal.expand(B, m, m)], -1)[:, None]
        out = F.scaled_dot_product_attention(
            heads(q, attn.num_heads), keys, values, attn_mask=mask, scale=attn.scaling, enable_gqa=True
        )
        h, _ = attn.o_proj(out.transpose(1, 2).reshape(B * m, -1))
        h, residual = layer.post_attention_layernorm(h, rep[None, :, :H].expand(B, m, H).reshape(B * m, H).to(h.dtype))
        h = layer.mlp(h)
        h, _ = self.model.norm(h, residual)
        return F.linear(h, self.lm_head.weight).view(B, m, -1)


def register_dart_model() -> None:
    """Make DART's architecture loadable by sglang's model loader (idempotent)."""
    from sglang.srt.models.registry import ModelRegistry

    ModelRegistry.models.setdefault(ARCHITECTURE, LlamaForCausalLMDart)


def make_dart_search(draft_path: str, vocab_size: int, use_ngram: bool, device) -> DartSearch:
    """The step search for a DART head directory: its n-gram trie (``ngram-trie.safetensors`` next
    to the head) when n-gram pruning is on; without a trie only the request's own n-grams count."""
    trie = load_head_trie(draft_path, vocab_size) if use_ngram else None
    search = DartSearch(vocab_size, trie=trie, use_ngram=use_ngram, combine_cfg=CombineConfig())
    log.info("ECHO DART drafter: %s (%s)", search.describe(), draft_path)
    return search.to(device)


class DartFrontierDrafter:
    """The core's drafter protocol for one ECHO step of the DART drafter (module docstring)."""

    def __init__(self, worker, batch, spec_info, search: DartSearch, history: TokenHistory):
        self.w, self.batch, self.search, self.history = worker, batch, search, history
        self.root_p, self.root_index = draft_extend_topk(worker, spec_info)  # marginal 1
        self.forwards = 0

    def propose(self, frontier: Frontier, k: int) -> Candidates:
        if frontier.depth == 0:
            self._begin(k)
        return self.search.propose(frontier, k)

    def adopt(self, parent: Tensor, tokens: Tensor, *, before: bool) -> None:
        self.search.adopt(parent, tokens, before=before)

    def _begin(self, k: int) -> None:
        """The step's marginals (one mask forward) -> ``search.begin``."""
        w, batch = self.w, self.batch
        model = w.draft_runner.model
        bs = batch.seq_lens.shape[0]
        seq_lens = batch.seq_lens.to(torch.int64)
        L = int(seq_lens.max())
        slots = w.req_to_token_pool.req_to_token[batch.req_pool_indices.long(), :L].long()
        pool = w.draft_runner.token_to_kv_pool
        layer_id = model.model.layers[0].self_attn.attn.layer_id
        logits = model.mask_logits(seq_lens, slots, pool.get_key_buffer(layer_id), pool.get_value_buffer(layer_id))
        self.forwards += 1
        K = min(max(self.search.cfg.topk, k), logits.shape[-1])
        lp, ids = torch.log_softmax(logits.float(), -1).topk(K, -1)  # [bs, d-1, K]
        if w.hot_token_id is not None:
            ids = w.hot_token_id[ids]
        # Marginal 1 has only the draft extend's top-k: pad it to K with impossible entries.
        k0 = min(self.root_p.shape[1], K)
        lp0 = torch.full((bs, 1, K), float("-inf"), device=lp.device)
        ids0 = torch.zeros(bs, 1, K, dtype=ids.dtype, device=ids.device)
        lp0[:, 0, :k0] = torch.log(self.root_p[:, :k0].float().clamp(min=1e-30))
        ids0[:, 0, :k0] = self.root_index[:, :k0].to(ids.dtype)
        # Under overlap scheduling output_ids lags one step: the n-gram context is then one step
        # stale, which changes draft quality only (the target verifies every token).
        hist, hist_len = self.history.gather(batch.reqs)
        ready = torch.ones(bs, dtype=torch.bool, device=lp.device)
        self.search.begin(torch.cat([lp0, lp], 1), torch.cat([ids0, ids], 1), hist, hist_len, ready)


class DartDrafting(StepDrafter):
    """DART's step: EAGLE's draft extends (marginal 1), one mask forward and DART's search (module
    docstring)."""

    kind = Drafter.DART

    def __init__(self) -> None:
        self.search: DartSearch | None = None  # set by attach
        self.history: TokenHistory | None = None  # the live requests' committed tokens

    def register_model(self) -> None:
        register_dart_model()

    def attach(self, dw) -> None:
        path = dw.server_args.speculative_draft_model_path
        if not isinstance(dw.draft_runner.model, LlamaForCausalLMDart):
            raise ValueError(
                f"ECHO drafter 'dart': {path} loaded as {type(dw.draft_runner.model).__name__}, not a DART head "
                "(LlamaForCausalLMDart)"
            )
        vocab = dw.target_worker.model_runner.model_config.vocab_size
        self.search = make_dart_search(path, vocab, dw.echo.cfg.dart_ngram, dw.device)
        self.history = TokenHistory(dw.device)

    def frontier(self, dw, batch, forward_batch, roots: Tensor) -> DartFrontierDrafter:
        return DartFrontierDrafter(dw, batch, batch.spec_info, self.search, self.history)
