"""The ECHO plugin makes ``echo_tree_triton`` known to sglang 0.5.23's registry and CLI choices."""

from __future__ import annotations


def test_the_plugin_registers_the_backend_lazily():

    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    from sglang_echo import plugin
    from sglang_echo.kernels import registration

    plugin.register()
    plugin.register()  # idempotent
    assert ATTENTION_BACKENDS[registration.BACKEND_NAME] is registration._create_backend
    assert registration.BACKEND_NAME in ATTENTION_BACKEND_CHOICES
    assert registration.register_sglang_backend() == registration.BACKEND_NAME


def test_the_backend_module_imports_and_exposes_its_factory():
    from sglang_echo.kernels.sglang_backend import BACKEND_NAME, EchoTreeVerifyBackend, create_backend

    assert BACKEND_NAME == "echo_tree_triton" and callable(create_backend)
    assert EchoTreeVerifyBackend.forward_extend is not None


# -- ragged verify through the backend's own entry points (no sglang runner: its parts are stand-ins) --
class _Mode:
    def is_target_verify(self) -> bool:
        return True


class _Pool:
    def __init__(self, k_cache, v_cache):
        self.k, self.v = k_cache, v_cache

    def get_key_buffer(self, layer_id):
        return self.k

    def get_value_buffer(self, layer_id):
        return self.v


def _backend(case, width: int, *, graphs: bool):
    """An EchoTreeVerifyBackend with just what its ragged paths read; sglang's prefix fill is a
    gather from a req_to_token table (request b's row: its prefix slots; padded slots: slot 0)."""
    import torch

    from sglang_echo.kernels.sglang_backend import EchoTreeVerifyBackend
    from sglang_echo.kernels.tree_attention.graph_buffers import TreeVerifyGraphBuffers

    b = object.__new__(EchoTreeVerifyBackend)
    b.device, b.num_draft_tokens, b.num_head, b.num_kv_head, b._head_dim, b._block_m = "cpu", width, 4, 2, 16, 8
    b._ragged_graphs, b._ragged, b._ragged_key, b._tree, b._tree_key = graphs, None, None, None, None
    b.max_context_len, b.forward_metadata, b.token_to_kv_pool = 64, None, _Pool(case.k_cache, case.v_cache)
    b.cuda_graph_kv_indices = torch.zeros(512, dtype=torch.int64)
    b._graph_bufs = TreeVerifyGraphBuffers(
        max_batch=8,
        max_width=width,
        kv_capacity=0,
        num_heads=4,
        head_dim=16,
        device="cpu",
        buckets=(64,),
        block_m=8,
        pad_chunk=32,
    )
    table = torch.zeros(8, 64, dtype=torch.int64)
    for i, p in enumerate(case.prefix_lens):
        table[i, :p] = case.kv_indices[int(case.kv_indptr[i]) : int(case.kv_indptr[i + 1])]

    def fill(plan, bs, seq_lens, req_pool_indices, kv_indices, kv_indptr=None):
        kv_indptr[1:] = torch.cumsum(seq_lens[:bs], 0)
        cols = torch.arange(64)
        take = cols[None, :] < seq_lens[:bs, None]
        kv_indices[: int(kv_indptr[-1])] = table[req_pool_indices[:bs]][take]

    b._fill_kv_indptr_and_indices = fill
    return b


def _compact_batch(case, lens, width, tier, slots, *, layout: bool):
    """A compact verify batch as sglang hands it to the backend (a replay view pads the slots)."""
    from types import SimpleNamespace

    import torch

    from sglang_echo.core.pack import pad_trees
    from sglang_echo.integration.ragged import MARK

    b, n = lens.numel(), case.q.shape[0]
    prefix = torch.tensor(case.prefix_lens)
    dense = pad_trees(case.trees, prefix, width).mask
    spec = SimpleNamespace(draft_token_num=width, custom_mask=dense.flatten(), **{MARK: lens})
    spec.ragged_verify_layout = SimpleNamespace(verify_lens=lens) if layout else None
    out_cache_loc = torch.zeros(tier, dtype=torch.int64)
    out_cache_loc[:n] = case.tree_slots
    seq_lens = torch.cat([prefix, torch.ones(slots - b, dtype=torch.int64)])
    return SimpleNamespace(
        forward_mode=_Mode(),
        batch_size=slots,
        input_ids=torch.zeros(tier, dtype=torch.int64),
        seq_lens=seq_lens,
        seq_lens_sum=int(seq_lens.sum()),
        req_pool_indices=torch.arange(slots),
        kv_loc_plan=None,
        spec_info=spec,
        out_cache_loc=out_cache_loc,
    )


def _layer(case, logit_cap=0.0):
    from types import SimpleNamespace

    return SimpleNamespace(
        layer_id=0,
        sliding_window_size=-1,
        logit_cap=logit_cap,
        qk_head_dim=16,
        v_head_dim=16,
        tp_q_head_num=4,
        tp_k_head_num=2,
        scaling=case.sm_scale,
    )


def _attend(backend, case, fb):
    import torch

    q = torch.randn(fb.input_ids.shape[0], 4 * 16) * 3  # padding lanes: garbage queries
    q[: case.q.shape[0]] = case.q.reshape(case.q.shape[0], -1)
    kv = torch.empty(0)  # the tree tokens' K/V are already in the cache (save_kv_cache=False)
    return backend.forward_extend(q, kv, kv, _layer(case), fb, save_kv_cache=False).view(-1, 4, 16)


def test_ragged_graph_replay_reuses_the_captured_metadata_and_attends_as_the_oracle():
    import torch

    from sglang_echo.integration.ragged import MARK

    from .cases import make_case, naive_attention

    case = make_case(11, 4, 9, 30, 4, 2, 16, min_prefix=1)
    lens, n = case.trees.sizes.to(torch.int32), case.q.shape[0]
    width, tier, slots = int(lens.max()) + 1, n + 9, lens.numel() + 2
    backend = _backend(case, width, graphs=True)
    capture = _compact_batch(case, lens, width, tier, slots, layout=False)
    delattr(capture.spec_info, MARK)  # sglang's capture-time verify input: no K, no layout
    backend.init_forward_metadata_out_graph(capture, in_capture=True)
    captured, tensors = backend.forward_metadata, backend._ragged
    assert not tensors.packed_mask.any()
    replay = _compact_batch(case, lens, width, tier, slots, layout=True)
    backend.init_forward_metadata_out_graph(replay)  # before a replay: the static views are refilled
    assert backend.forward_metadata is captured and backend._ragged is tensors
    out = _attend(backend, case, replay)
    torch.testing.assert_close(out[:n].double(), naive_attention(case), atol=1e-5, rtol=1e-5)
    assert (out[n:] == 0).all()
    eager_backend = _backend(case, width, graphs=False)
    eager = _compact_batch(case, lens, width, n, lens.numel(), layout=False)  # no graph: T = N, B slots
    eager_backend.init_forward_metadata(eager)
    torch.testing.assert_close(_attend(eager_backend, case, eager), out[:n], atol=1e-6, rtol=1e-6)


def test_ragged_verify_refuses_a_layer_it_does_not_compute():
    import pytest
    import torch

    from .cases import make_case

    case = make_case(12, 2, 5, 10, 4, 2, 16, min_prefix=1)
    lens = case.trees.sizes.to(torch.int32)
    width = int(lens.max())
    backend = _backend(case, width, graphs=False)
    fb = _compact_batch(case, lens, width, case.q.shape[0], lens.numel(), layout=False)
    backend.init_forward_metadata(fb)
    q = torch.zeros(case.q.shape[0], 64)
    with pytest.raises(NotImplementedError, match="logit soft-cap .*verify=padded"):
        backend.forward_extend(q, q, q, _layer(case, logit_cap=30.0), fb, save_kv_cache=False)


def test_the_inherited_prefix_fill_takes_an_indptr_buffer():
    import inspect

    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    params = list(inspect.signature(TritonAttnBackend._fill_kv_indptr_and_indices).parameters)
    assert params == ["self", "plan", "bs", "seq_lens", "req_pool_indices", "kv_indices", "kv_indptr"]
