"""Ragged verify (integration/ragged.py): the target forward runs on the real tree nodes only.

* Unit: the packed rows, the compact batch (inputs, KV write ids through a KVLocPlan stand-in,
  token counts), the scatter back to B*W rows, mode resolution; the ``echo_torch`` backend's
  ragged metadata gives the real rows exactly the attention output of the padded layout.
* Server (SmolLM2 + the shipped EAGLE-3 head, and the n-gram drafter): ragged and padded-dense
  verify accept the same tokens: identical outputs, verify steps and accepted drafts per
  request, for one batch submitted at once (so both servers see the same batches), with K_max
  binding; the target computed sum K_i tokens per step in ragged mode and B*W padded.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import requests
import torch

from sglang_echo.integration.ragged import (
    MARK,
    compact_verify_batch,
    expand_outputs,
    ragged_rows,
    resolve_verify_mode,
    target_tokens,
)
from sglang_echo.platform.attention.paged_sdpa import paged_sdpa
from tests.platform.test_ops import _random_tree_mask

from .conftest import MAX_NEW_TOKENS, scrape, start


# -- unit ----------------------------------------------------------------------------------------
def test_ragged_rows_are_the_first_k_slots_of_each_request() -> None:
    assert ragged_rows(torch.tensor([3, 1, 2]), 4).tolist() == [0, 1, 2, 4, 8, 9]
    assert target_tokens("ragged", torch.tensor([3, 1, 2]), 4) == 6
    assert target_tokens("padded", torch.tensor([3, 1, 2]), 4) == 12


class _Plan:
    """KVLocPlan stand-in: ``bind(cols=rows)`` is how sglang maps packed rows to write ids."""

    def __init__(self, window: torch.Tensor) -> None:
        self.window = window

    def bind(self, batch, reader, *, cols=None) -> None:
        batch.kv_loc_plan, batch.kv_loc_cols = self, cols
        batch.out_cache_loc = self.window[cols]


def _batch(bs: int, width: int, plan=None):
    n = bs * width
    return SimpleNamespace(
        batch_size=bs, input_ids=torch.arange(100, 100 + n), positions=torch.arange(n) % width + 50,
        out_cache_loc=torch.arange(1000, 1000 + n), kv_loc_plan=plan, kv_loc_cols=None, input_embeds=None,
        mrope_positions=None, origin_out_cache_loc=None, global_num_tokens_cpu=None,
        global_num_token_non_padded=torch.tensor(n), global_num_token_non_padded_cpu=n, num_token_non_padded=None,
    )


@pytest.mark.parametrize("with_plan", [False, True])
def test_compact_batch_keeps_real_rows_and_their_kv_slots(with_plan: bool) -> None:
    lens = torch.tensor([2, 4, 1])
    fb = _batch(3, 4, _Plan(torch.arange(7000, 7012)) if with_plan else None)
    compact, rows, dense = compact_verify_batch(fb, lens, translator=None)
    assert dense == 12 and rows.tolist() == [0, 1, 4, 5, 6, 7, 8]
    assert compact.input_ids.tolist() == (fb.input_ids[rows]).tolist()
    assert compact.positions.tolist() == (fb.positions[rows]).tolist()
    base = 7000 if with_plan else 1000
    assert compact.out_cache_loc.tolist() == (rows + base).tolist()
    assert compact.global_num_token_non_padded_cpu == 7 and int(compact.global_num_token_non_padded) == 7
    assert fb.input_ids.numel() == 12 and fb.global_num_token_non_padded_cpu == 12  # original untouched


def test_compact_batch_refuses_what_it_cannot_compact() -> None:
    fb = _batch(2, 3)
    with pytest.raises(ValueError, match="lens"):
        compact_verify_batch(fb, torch.tensor([4, 1]), translator=None)  # wider than W
    with pytest.raises(ValueError, match="lens"):
        compact_verify_batch(fb, torch.tensor([0, 1]), translator=None)  # no root
    fb.input_embeds = torch.zeros(6, 2)
    with pytest.raises(NotImplementedError, match="input_embeds"):
        compact_verify_batch(fb, torch.tensor([1, 1]), translator=None)


def test_outputs_scatter_back_to_dense_rows() -> None:
    rows = torch.tensor([0, 1, 4])
    out = SimpleNamespace(next_token_logits=torch.tensor([[1.0], [2.0], [3.0]]),
                          hidden_states=torch.ones(3, 2), hidden_states_before_norm=None)
    expand_outputs(out, rows, 6)
    assert out.next_token_logits[:, 0].tolist() == [1.0, 2.0, 0.0, 0.0, 3.0, 0.0]
    assert out.hidden_states.shape == (6, 2) and out.hidden_states[[2, 3, 5]].abs().sum() == 0


def _backend_class():
    # Imported in the test, not at collection: the backend imports sglang, which imports Triton,
    # and tests/kernels must be the first to import Triton (with TRITON_INTERPRET set).
    from sglang_echo.platform.attention.backend import EchoTorchAttnBackend

    return EchoTorchAttnBackend


def test_verify_mode_resolution() -> None:
    EchoTorchAttnBackend = _backend_class()
    assert resolve_verify_mode("auto", EchoTorchAttnBackend) == "ragged"
    assert resolve_verify_mode("auto", object()) == "padded"
    assert resolve_verify_mode("padded", EchoTorchAttnBackend) == "padded"
    with pytest.raises(ValueError, match="ragged tree verify"):
        resolve_verify_mode("ragged", object())


class _Mode:
    def is_decode_or_idle(self) -> bool:
        return False

    def is_target_verify(self) -> bool:
        return True


@pytest.mark.parametrize("seed", range(3))
def test_backend_ragged_metadata_matches_padded_attention(seed: int) -> None:
    """Real rows attend exactly as in the padded layout; padding is neither computed nor seen."""
    g = torch.Generator().manual_seed(seed)
    H, HKV, D, W, pool = 4, 2, 8, 5, 256
    prefix, lens = torch.tensor([3, 7, 1]), torch.tensor([5, 2, 3])
    bs = len(prefix)
    anc = _random_tree_mask(g, bs, W)
    real = torch.arange(W)[None, :] < lens[:, None]  # real nodes: slots [0, K_b); padding sees itself only
    anc = torch.where(real[:, :, None] & real[:, None, :], anc, torch.eye(W, dtype=torch.bool)[None])
    runner = SimpleNamespace(device="cpu", req_to_token_pool=None, token_to_kv_pool=None)
    backend = _backend_class()(runner)

    def metadata(spec):
        backend.init_forward_metadata(SimpleNamespace(forward_mode=_Mode(), seq_lens=prefix, spec_info=spec))
        return backend.extend_metadata

    spec = SimpleNamespace(draft_token_num=W, tree_topk=-1, custom_mask=anc.reshape(-1))
    dense_md = metadata(spec)
    setattr(spec, MARK, lens)
    ragged_md = metadata(spec)
    assert ragged_md.q_lens.tolist() == lens.tolist() and ragged_md.kv_lens.tolist() == (prefix + lens).tolist()

    kb, vb = torch.randn(pool, HKV, D, generator=g), torch.randn(pool, HKV, D, generator=g)
    r2t = torch.randperm(pool, generator=g)[: bs * 32].view(bs, 32)
    req = torch.arange(bs)
    q = torch.randn(bs * W, H, D, generator=g)
    rows = ragged_rows(lens, W)
    scale = 1 / math.sqrt(D)
    dense = paged_sdpa(q, kb, vb, r2t, req, dense_md.q_lens, dense_md.kv_lens, dense_md.tree, scale)
    ragged = paged_sdpa(q[rows], kb, vb, r2t, req, ragged_md.q_lens, ragged_md.kv_lens, ragged_md.tree, scale)
    torch.testing.assert_close(ragged, dense[rows], rtol=1e-5, atol=1e-6)


# -- server --------------------------------------------------------------------------------------
BATCH = 8
K_MAX = 16  # < 8 requests x 7 slots: the budget binds, trees are ragged


def _batch_generate(url: str, inputs: list[list[int]]) -> list[dict]:
    """One /generate call for the whole batch: every request is scheduled together."""
    body = {"input_ids": inputs, "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0.0}}
    r = requests.post(url + "/generate", json=body, timeout=600)
    r.raise_for_status()
    return r.json()


def _serve(model, draft, env, mode: str, inputs: list[list[int]]):
    tag = f"{env.get('SGLANG_ECHO_DRAFTER', 'eagle3')}-{mode}"
    srv = start(model, spec="echo", draft=draft, env={**env, "SGLANG_ECHO_VERIFY": mode}, tag=tag)
    try:
        out = _batch_generate(srv.base_url, inputs)
        metrics = scrape(srv.base_url)
    finally:
        srv.stop()
    return out, metrics


def _check_same_acceptance(ragged, padded) -> None:
    (r_out, r_m), (p_out, p_m) = ragged, padded
    for i, (r, p) in enumerate(zip(r_out, p_out)):
        assert r["output_ids"] == p["output_ids"], f"request {i}: outputs differ"
        for key in ("spec_verify_ct", "spec_num_correct_drafts"):
            assert r["meta_info"][key] == p["meta_info"][key], f"request {i}: {key} differs"
    assert sum(r["meta_info"]["spec_num_correct_drafts"] for r in r_out) > 0  # drafts were accepted
    # Ragged: the target computed exactly the verified tokens; padded: B*W per step, more.
    assert r_m["echo_target_tokens_total"] == r_m["echo_verified_tokens_total"]
    assert p_m["echo_target_tokens_total"] > p_m["echo_verified_tokens_total"] == r_m["echo_verified_tokens_total"]
    print(f"verified {r_m['echo_verified_tokens_total']:.0f} tokens; target forward tokens ragged "
          f"{r_m['echo_target_tokens_total']:.0f} vs padded {p_m['echo_target_tokens_total']:.0f}")


@pytest.fixture(scope="module")
def batch_inputs(smollm2_dir) -> list[list[int]]:
    from transformers import AutoTokenizer

    from sglang_echo.models import prompts

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    texts = [p.as_text(tok) for p in prompts.load_mixed(2)][:BATCH]
    return [tok(t, add_special_tokens=False).input_ids[-96:] for t in texts]


@pytest.mark.server
def test_ragged_equals_padded_eagle3(smollm2_dir, batch_inputs) -> None:
    from sglang_echo.models.drafts import stage_head

    draft = stage_head(smollm2_dir)
    env = {"SGLANG_ECHO_POLICY": "echo", "SGLANG_ECHO_K_MAX": str(K_MAX)}
    _check_same_acceptance(_serve(smollm2_dir, draft, env, "ragged", batch_inputs),
                           _serve(smollm2_dir, draft, env, "padded", batch_inputs))


@pytest.mark.server
def test_ragged_equals_padded_ngram(smollm2_dir, batch_inputs) -> None:
    env = {"SGLANG_ECHO_POLICY": "echo", "SGLANG_ECHO_K_MAX": str(K_MAX), "SGLANG_ECHO_DRAFTER": "ngram"}
    _check_same_acceptance(_serve(smollm2_dir, None, env, "ragged", batch_inputs),
                           _serve(smollm2_dir, None, env, "padded", batch_inputs))
