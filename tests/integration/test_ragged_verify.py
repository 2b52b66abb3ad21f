"""Ragged verify (integration/ragged.py): the target forward runs on the real tree nodes only.

* Unit: the packed rows, the compact batch (inputs, KV write ids through a KVLocPlan stand-in,
  token counts) eager and padded to a CUDA-graph token tier (sglang's layout, sink writes), the
  tier choice, the hook end to end, the scatter back to B*W rows, the marks, mode resolution and
  its refusals, when ECHO asks sglang for ragged graphs, the launcher's compact mode; the
  ``echo_torch`` backend's ragged metadata gives the real rows exactly the attention output of
  the padded layout.
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
    TOTAL,
    compact_verify_batch,
    expand_outputs,
    graph_tier,
    mark_verify,
    ragged_rows,
    ragged_verify_forward,
    resolve_verify_mode,
    target_tokens,
    wants_ragged_graphs,
)
from sglang_echo.platform.attention.paged_sdpa import paged_sdpa
from tests.platform.test_ops import _random_tree_mask

from .conftest import MAX_NEW_TOKENS, scrape, start


# -- unit ----------------------------------------------------------------------------------------
def test_ragged_rows_are_the_first_k_slots_of_each_request() -> None:
    assert ragged_rows(torch.tensor([3, 1, 2]), 4).tolist() == [0, 1, 2, 4, 8, 9]
    assert target_tokens("ragged", torch.tensor([3, 1, 2]), 4) == 6  # the CPU platform: no graph runner
    assert target_tokens("ragged", torch.tensor([3, 1, 2]), 4, total=6) == 6
    assert target_tokens("padded", torch.tensor([3, 1, 2]), 4) == 12


class _Plan:
    """KVLocPlan stand-in with sglang's semantics: ``bind(cols=lanes)`` takes each lane's write id
    from the window, ``-1`` naming the sink (slot 0)."""

    def __init__(self, window: torch.Tensor) -> None:
        self.window = window

    def bind(self, batch, reader, *, cols=None) -> None:
        batch.kv_loc_plan, batch.kv_loc_cols = self, cols
        batch.out_cache_loc = torch.where(cols >= 0, self.window[cols.clamp(min=0)], 0)


def _batch(bs: int, width: int, plan=None):
    n = bs * width
    return SimpleNamespace(
        batch_size=bs,
        input_ids=torch.arange(100, 100 + n),
        positions=torch.arange(n) % width + 50,
        out_cache_loc=torch.arange(1000, 1000 + n),
        kv_loc_plan=plan,
        kv_loc_cols=None,
        input_embeds=None,
        mrope_positions=None,
        origin_out_cache_loc=None,
        global_num_tokens_cpu=None,
        global_num_token_non_padded=torch.tensor(n),
        global_num_token_non_padded_cpu=n,
        num_token_non_padded=None,
        spec_info=SimpleNamespace(draft_token_num=width, positions=torch.arange(n)),
    )


@pytest.mark.parametrize("with_plan", [False, True])
def test_compact_batch_keeps_real_rows_and_their_kv_slots(with_plan: bool) -> None:
    lens = torch.tensor([2, 4, 1])
    fb = _batch(3, 4, _Plan(torch.arange(7000, 7012)) if with_plan else None)
    c = compact_verify_batch(fb, lens, translator=None)
    compact, rows = c.batch, c.rows
    assert c.dense_tokens == 12 and c.lanes == 7 and rows.tolist() == [0, 1, 4, 5, 6, 7, 8]
    assert compact.input_ids.tolist() == (fb.input_ids[rows]).tolist()
    assert compact.positions.tolist() == (fb.positions[rows]).tolist()
    base = 7000 if with_plan else 1000
    assert compact.out_cache_loc.tolist() == (rows + base).tolist()
    assert compact.global_num_token_non_padded_cpu == 7 and int(compact.global_num_token_non_padded) == 7
    assert fb.input_ids.numel() == 12 and fb.global_num_token_non_padded_cpu == 12  # original untouched
    assert compact.spec_info is not fb.spec_info and compact.spec_info.positions is compact.positions
    assert getattr(compact.spec_info, "ragged_verify_layout", None) is None  # eager: no layout, no graph


@pytest.mark.parametrize("with_plan", [False, True])
@pytest.mark.parametrize("tier", [7, 14])  # N == tier, N < tier
def test_a_tier_pads_the_compact_batch_and_carries_sglangs_layout(with_plan: bool, tier: int) -> None:
    lens = torch.tensor([2, 4, 1], dtype=torch.int32)
    fb = _batch(3, 4, _Plan(torch.arange(7000, 7012)) if with_plan else None)
    c = compact_verify_batch(fb, lens, translator=None, total=7, tier=tier)
    compact, pad = c.batch, tier - 7
    assert c.lanes == tier and c.rows.tolist() == [0, 1, 4, 5, 6, 7, 8]
    assert compact.input_ids.tolist() == fb.input_ids[c.rows].tolist() + [0] * pad  # padding: token 0 ...
    assert compact.positions.tolist() == fb.positions[c.rows].tolist() + [0] * pad  # ... at position 0 ...
    base = 7000 if with_plan else 1000
    assert compact.out_cache_loc.tolist() == (c.rows + base).tolist() + [0] * pad  # ... writing the sink
    assert compact.global_num_token_non_padded_cpu == tier  # every lane is computed
    layout = compact.spec_info.ragged_verify_layout
    assert layout.graph_num_tokens == tier and layout.verify_lens.tolist() == [2, 4, 1]
    assert layout.qo_indptr_device.tolist() == [0, 2, 6, 7]
    assert getattr(fb.spec_info, "ragged_verify_layout", None) is None  # the dense input stays unmarked
    with pytest.raises(ValueError, match="do not fit tier 6"):
        compact_verify_batch(fb, lens, translator=None, tier=6)


def test_a_step_narrower_than_w_compacts_at_its_own_width() -> None:
    """W_s < W: the dense layout is W_s wide (the step's verify input), so is the lane map."""
    fb = _batch(2, 3)  # W_s = 3 (W may be 7)
    c = compact_verify_batch(fb, torch.tensor([3, 1]), translator=None)
    assert c.rows.tolist() == [0, 1, 2, 3] and c.dense_tokens == 6


def test_compact_batch_refuses_what_it_cannot_compact() -> None:
    fb = _batch(2, 3)
    with pytest.raises(ValueError, match="lens"):
        compact_verify_batch(fb, torch.tensor([4, 1]), translator=None)  # wider than W
    with pytest.raises(ValueError, match="lens"):
        compact_verify_batch(fb, torch.tensor([0, 1]), translator=None)  # an empty request: no root
    fb.input_embeds = torch.zeros(6, 2)
    with pytest.raises(NotImplementedError, match="input_embeds"):
        compact_verify_batch(fb, torch.tensor([1, 1]), translator=None)


def test_outputs_scatter_back_to_dense_rows() -> None:
    rows = torch.tensor([0, 1, 4])
    out = SimpleNamespace(
        next_token_logits=torch.tensor([[1.0], [2.0], [3.0]]),
        hidden_states=torch.ones(3, 2),
        hidden_states_before_norm=None,
    )
    expand_outputs(out, rows, 6)
    assert out.next_token_logits[:, 0].tolist() == [1.0, 2.0, 0.0, 0.0, 3.0, 0.0]
    assert out.hidden_states.shape == (6, 2) and out.hidden_states[[2, 3, 5]].abs().sum() == 0
    tier = SimpleNamespace(
        next_token_logits=torch.tensor([[1.0], [2.0], [3.0], [9.0], [9.0]]),
        hidden_states=torch.ones(5, 2),
        hidden_states_before_norm=None,
    )
    expand_outputs(tier, rows, 6, lanes=5)  # padding lanes 3, 4 are dropped
    assert tier.next_token_logits[:, 0].tolist() == [1.0, 2.0, 0.0, 0.0, 3.0, 0.0]
    assert tier.hidden_states.shape == (6, 2)


class _Runner:
    """sglang's DecodeCudaGraphRunner as graph_tier reads it: the spec default capture_bs x W=7."""

    def __init__(self, compact: bool = True, graph_backend: bool = True, max_bs: int = 48) -> None:
        bs = [*range(1, 9), *range(10, 33, 2), *range(40, 49, 4)]
        self.ragged_verify_mode, self.max_bs = compact, max_bs
        self.capture_num_tokens = sorted({b * 7 for b in bs if b <= max_bs})
        self.attn_backend = SimpleNamespace(supports_ragged_verify_graph=graph_backend)

    def _ragged_capture_slots(self, num_tokens: int) -> int:
        return min(num_tokens, self.max_bs)


def test_graph_tier_rounds_up_where_the_runner_replays() -> None:
    r = _Runner()
    assert graph_tier(48, 8, r) == 49 and graph_tier(57, 8, r) == 70 and graph_tier(100, 30, r) == 112
    assert graph_tier(56, 8, r) == 56  # N == tier
    assert graph_tier(337, 48, r) is None  # past the largest tier (336)
    assert graph_tier(300, 49, r) is None  # more requests than max_bs
    assert graph_tier(5, 4, _Runner(max_bs=4)) == 7 and graph_tier(9, 5, _Runner(max_bs=4)) is None
    assert graph_tier(20, 8, None) is None  # no graphs: eager, T = N
    assert graph_tier(20, 8, _Runner(compact=False)) is None  # uniform W-wide graphs
    assert graph_tier(20, 8, _Runner(graph_backend=False)) is None
    assert target_tokens("ragged", torch.ones(8, dtype=torch.int32) * 2, 7, r, total=16) == 21


def test_the_hook_pads_to_the_runners_tier_and_scatters_back() -> None:
    """ModelRunner.forward's AROUND hook: the model sees T lanes; sglang's acceptance sees B*W rows."""
    lens = torch.tensor([2, 4, 2], dtype=torch.int32)
    fb = _batch(3, 4)
    fb.forward_mode = SimpleNamespace(is_target_verify=lambda: True)
    setattr(fb.spec_info, MARK, lens)
    setattr(fb.spec_info, TOTAL, 8)
    seen = []

    def original(runner, batch):
        seen.append(batch)
        logits = batch.input_ids.float()[:, None]  # row t: its lane's token id
        return SimpleNamespace(
            logits_output=SimpleNamespace(next_token_logits=logits, hidden_states=None, hidden_states_before_norm=None)
        )

    for graphs, lanes in ((None, 8), (_Runner(), 14)):  # N = 8: eager, or tier 14
        runner = SimpleNamespace(kv_index_translator=None, decode_cuda_graph_runner=graphs)
        out = ragged_verify_forward(original, runner, fb)
        assert seen[-1].input_ids.numel() == lanes
        assert (getattr(seen[-1].spec_info, "ragged_verify_layout", None) is not None) == (graphs is not None)
        dense = out.logits_output.next_token_logits[:, 0]
        real = torch.zeros(12, dtype=torch.bool)
        real[[0, 1, 4, 5, 6, 7, 8, 9]] = True
        assert torch.equal(dense[real], fb.input_ids[real].float()) and (dense[~real] == 0).all()


def test_marks_follow_the_layout() -> None:
    vi = SimpleNamespace()
    mark_verify(vi, torch.tensor([3, 3]), 6, 3, always=False)  # every tree fills W_s: dense is ragged
    assert getattr(vi, MARK, None) is None
    mark_verify(vi, torch.tensor([3, 3]), 6, 3, always=True)  # compact graphs: every verify is compacted
    assert getattr(vi, MARK).tolist() == [3, 3] and getattr(vi, TOTAL) == 6
    vi = SimpleNamespace()
    mark_verify(vi, torch.tensor([3, 1]), 4, 3, always=False)
    assert getattr(vi, TOTAL) == 4


def _backend_class():
    # Imported in the test, not at collection: the backend imports sglang, which imports Triton,
    # and tests/kernels must be the first to import Triton (with TRITON_INTERPRET set).
    from sglang_echo.platform.attention.backend import EchoTorchAttnBackend

    return EchoTorchAttnBackend


def _named(name: str, trees: bool, graphs: bool):
    return SimpleNamespace(
        decode_attention_backend_str=name, supports_ragged_verify=trees, supports_ragged_verify_graph=graphs
    )


def test_verify_mode_resolution(monkeypatch, caplog) -> None:
    EchoTorchAttnBackend = _backend_class()
    assert resolve_verify_mode("auto", EchoTorchAttnBackend) == "ragged"
    assert resolve_verify_mode("auto", object()) == "padded"
    assert resolve_verify_mode("padded", EchoTorchAttnBackend) == "padded"
    with pytest.raises(
        ValueError,
        match=r"^ECHO verify=ragged: attention backend 'flashinfer' cannot verify ragged "
        r"trees .*--attention-backend echo_tree_triton, or set verify=padded",
    ):
        resolve_verify_mode("ragged", _named("flashinfer", False, False))
    with pytest.raises(
        ValueError, match="'echo_torch' verifies ragged trees only without CUDA graphs; add --disable-cuda-graph"
    ):
        resolve_verify_mode("ragged", _named("echo_torch", True, False), _Runner())
    tree = _named("echo_tree_triton", True, True)
    assert resolve_verify_mode("ragged", tree, _Runner()) == "ragged"
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "static")
    with pytest.raises(ValueError, match=r"needs SGLANG_RAGGED_VERIFY_MODE=compact \(got 'static'\)"):
        resolve_verify_mode("ragged", tree, _Runner(compact=False))
    with caplog.at_level("INFO", logger="sglang_echo.integration.ragged"):
        assert resolve_verify_mode("auto", tree, _Runner(compact=False)) == "padded"
    assert "SGLANG_RAGGED_VERIFY_MODE=compact" in caplog.text and "B x W tokens" in caplog.text


def test_ragged_graphs_are_asked_for_only_where_they_replay(monkeypatch) -> None:
    assert wants_ragged_graphs("auto", "eagle3", "cuda", "echo_tree_triton")
    assert wants_ragged_graphs("ragged", "dflash", "cuda", "echo_tree_triton")
    assert not wants_ragged_graphs("padded", "eagle3", "cuda", "echo_tree_triton")
    assert not wants_ragged_graphs("auto", "ngram", "cuda", "echo_tree_triton")  # NGRAM's uniform graphs
    assert not wants_ragged_graphs("auto", "eagle3", "cpu", "echo_tree_triton")
    assert not wants_ragged_graphs("auto", "eagle3", "cuda", "triton")
    import sglang.srt.runtime_context as rc

    from sglang_echo.integration.spec import EchoSpecAlgo

    sa = SimpleNamespace(
        device="cuda",
        attention_backend="echo_tree_triton",
        decode_attention_backend=None,
        prefill_attention_backend=None,
        speculative_num_steps=None,
        speculative_eagle_topk=None,
        speculative_num_draft_tokens=None,
    )
    monkeypatch.setattr(rc, "get_server_args", lambda: sa)
    algo = SimpleNamespace(drafter="eagle3")
    assert EchoSpecAlgo.supports_ragged_verify(algo)
    monkeypatch.setenv("SGLANG_ECHO_VERIFY", "padded")
    assert not EchoSpecAlgo.supports_ragged_verify(algo)


def test_the_launcher_sets_sglangs_compact_mode_for_echo_tree_triton(tmp_path, monkeypatch) -> None:
    from sglang_echo.serve.flags import ServerOptions, build_command

    monkeypatch.delenv("SGLANG_RAGGED_VERIFY_MODE", raising=False)

    def env(**kw):
        return build_command(ServerOptions(model_path=tmp_path, **kw)).env.get("SGLANG_RAGGED_VERIFY_MODE")

    assert env(spec="echo", device="cuda", attention_backend="echo_tree_triton") == "compact"
    assert env(spec="echo", device="cuda", extra_args=("--attention-backend", "echo_tree_triton")) == "compact"
    assert env(spec="echo", device="cuda") == "compact"  # ECHO on a GPU decodes with echo_tree_triton by default
    assert env(spec="echo", device="cuda", attention_backend="triton") is None  # sglang's triton: no ragged trees
    argv = build_command(ServerOptions(model_path=tmp_path, spec="echo", device="cuda")).argv
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--attention-backend"][-1] == "echo_tree_triton"
    assert env(spec="eagle3", device="cuda", attention_backend="echo_tree_triton", draft_path=tmp_path) is None
    assert env(spec="echo", device="cpu", attention_backend="echo_tree_triton") is None
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "static")  # the operator's choice wins
    assert env(spec="echo", device="cuda", attention_backend="echo_tree_triton") is None


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


# -- the worker's side ----------------------------------------------------------------------------
def test_with_ragged_graphs_every_verify_is_marked(monkeypatch) -> None:
    """Under compact graphs an unmarked TARGET_VERIFY would run eagerly: a step whose every tree
    fills its width is marked too (without graphs it is not: its dense layout is the ragged one)."""
    from sglang_echo.integration import draft_worker

    from .test_plain_step import _batch as step_batch
    from .test_plain_step import _worker

    monkeypatch.setattr(draft_worker, "prepare_for_draft", None)  # a plain step never reaches it
    for graphs in (False, True):
        w = _worker(cap=4)
        w.echo.ragged_graphs = graphs
        vi = w.draft(step_batch(4))
        assert (getattr(vi, MARK, None) is not None) == graphs
        if graphs:
            assert getattr(vi, MARK).tolist() == [1, 1, 1, 1] and getattr(vi, TOTAL) == 4


def test_a_full_mask_buffer_is_filled_for_padded_verify() -> None:
    """Padded verify under CUDA graphs on a backend with a FULL_MASK buffer (sglang's triton,
    echo_tree_triton without ragged graphs): the mask is copied into it, in its byte dtype."""
    from sglang.srt.layers.attention.verify_mask import VerifyMask
    from sglang.srt.speculative.eagle_utils import TreeMaskMode

    from sglang_echo.core.dense import plain_dense

    from .test_plain_step import _worker

    w = _worker(cap=4)
    seq_lens = torch.tensor([5, 9, 3])
    dense = plain_dense(torch.tensor([11, 12, 13]), seq_lens, full_mask=True)
    vm = VerifyMask(buffer=torch.zeros(4 * 1 * (16 + 1), dtype=torch.uint8), mode=TreeMaskMode.FULL_MASK, max_bs=4)
    vi = w._verify_input(dense, 1, vm, 3, None)
    assert vi.custom_mask.data_ptr() == vm.buffer.data_ptr() and vi.custom_mask.numel() == int((seq_lens + 1).sum())
    assert torch.equal(vi.custom_mask.bool(), dense.custom_mask)


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
    print(
        f"verified {r_m['echo_verified_tokens_total']:.0f} tokens; target forward tokens ragged "
        f"{r_m['echo_target_tokens_total']:.0f} vs padded {p_m['echo_target_tokens_total']:.0f}"
    )


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
    _check_same_acceptance(
        _serve(smollm2_dir, draft, env, "ragged", batch_inputs), _serve(smollm2_dir, draft, env, "padded", batch_inputs)
    )


@pytest.mark.server
def test_ragged_equals_padded_ngram(smollm2_dir, batch_inputs) -> None:
    env = {"SGLANG_ECHO_POLICY": "echo", "SGLANG_ECHO_K_MAX": str(K_MAX), "SGLANG_ECHO_DRAFTER": "ngram"}
    _check_same_acceptance(
        _serve(smollm2_dir, None, env, "ragged", batch_inputs), _serve(smollm2_dir, None, env, "padded", batch_inputs)
    )
