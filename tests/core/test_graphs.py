"""The graphed tree builder's stages (:mod:`sglang_echo.core.graphs`) build exactly the trees of
``build_trees`` + ``pad_trees``, without a host sync, so a CUDA graph can capture them.

On the CPU the stages run eagerly (``graphs=False``); ``test_cuda_graph_replay_equals_eager``
replays the captured graphs on a GPU (``-m gpu``)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from sglang_echo.bench.scheduler import OpCounter
from sglang_echo.core import PolicyConfig, TreePolicy, build_trees, make_policy
from sglang_echo.core.dense import dense_from_padded, to_sglang_dense
from sglang_echo.core.factory import POLICIES, max_tree_size
from sglang_echo.core.graphs import GraphedTreeBuilder
from sglang_echo.core.pack import pad_pool, pad_trees
from sglang_echo.core.synthetic import SyntheticDrafter, SyntheticWorld

B, VOCAB = 24, 3000
# K_max = 5B: requests stop at different depths, some are widened (tree sizes 3-9 under ECHO).
CFG = PolicyConfig(k_max=5 * B, max_depth=6, w_def=1, w_max=4, topk=3, total_tokens=12)
PADDED = ("tokens", "parents", "depth", "positions", "mask", "valid")
DENSE = (
    "draft_token",
    "positions",
    "custom_mask",
    "retrieve_index",
    "retrieve_next_token",
    "retrieve_next_sibling",
    "tree_mask",
    "valid",
    "sizes",
)


def inputs(seed: int, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    roots = torch.randint(0, VOCAB, (B,), generator=g).to(device)
    prefix = torch.randint(1, 500, (B,), generator=g).to(device)
    return roots, prefix


def assert_same(a, b, names):
    for name in names:
        assert torch.equal(getattr(a, name).cpu(), getattr(b, name).cpu()), name


@pytest.mark.parametrize("stop_early", [True, False])
@pytest.mark.parametrize("name", POLICIES)
def test_stages_equal_build_trees(name, stop_early):
    world = SyntheticWorld(B, vocab=VOCAB, seed=1)
    width = max_tree_size(name, CFG)
    builder = GraphedTreeBuilder(
        make_policy(name, CFG), SyntheticDrafter(world), B, width, "cpu", stop_early=stop_early
    )
    for seed in range(4):  # one builder, many steps: nothing leaks from one step into the next
        roots, prefix = inputs(seed)
        trees, _ = build_trees(make_policy(name, CFG), SyntheticDrafter(world), roots)
        assert int(trees.sizes.max()) <= width
        assert_same(builder(roots, prefix), pad_trees(trees, prefix, width), PADDED)


@pytest.mark.parametrize("name", ["echo", "static-tree"])
def test_dense_layout_equals_the_servers(name):
    world = SyntheticWorld(B, vocab=VOCAB, seed=2)
    width = max_tree_size(name, CFG) + 3  # padding slots too
    builder = GraphedTreeBuilder(
        make_policy(name, CFG), SyntheticDrafter(world), B, width, "cpu", finish=dense_from_padded
    )
    roots, prefix = inputs(7)
    trees, _ = build_trees(make_policy(name, CFG), SyntheticDrafter(world), roots)
    assert_same(builder(roots, prefix), to_sglang_dense(trees, prefix, width), DENSE)


@pytest.mark.parametrize("name", POLICIES)
def test_stages_never_sync(name):
    """No ``int(t)``, ``bool(t)`` or ``nonzero`` anywhere: what CUDA graph capture requires."""
    drafter = SyntheticDrafter(SyntheticWorld(B, vocab=VOCAB, seed=3))
    builder = GraphedTreeBuilder(
        make_policy(name, CFG), drafter, B, max_tree_size(name, CFG), "cpu", finish=dense_from_padded, stop_early=False
    )
    with OpCounter() as counter:
        builder(*inputs(0))
    assert counter.ops > 0 and counter.syncs == 0, (counter.ops, counter.syncs)


@pytest.mark.parametrize("name", ["echo", "budgeted-chain", "static-tree"])
def test_every_stage_compiles_to_one_graph(name):
    """``compile=`` traces each stage whole (``fullgraph=True`` raises on a graph break) and the
    traced stages build the same layouts. ``aot_eager`` traces as Inductor would, without codegen."""
    world = SyntheticWorld(B, vocab=VOCAB, seed=6)
    width = max_tree_size(name, CFG)
    builder = GraphedTreeBuilder(
        make_policy(name, CFG), SyntheticDrafter(world), B, width, "cpu", finish=dense_from_padded, compile="aot_eager"
    )
    for seed in range(3):
        roots, prefix = inputs(seed)
        trees, _ = build_trees(make_policy(name, CFG), SyntheticDrafter(world), roots)
        # After the first step nothing recompiles (a GPU capture could not), so the stages see
        # inputs of the same shapes and strides every step.
        with torch._dynamo.config.patch(error_on_recompile=seed > 0):
            assert_same(builder(roots, prefix), to_sglang_dense(trees, prefix, width), DENSE)


def test_pad_pool_cuts_a_wide_tree_to_an_ancestor_closed_prefix():
    world = SyntheticWorld(B, vocab=VOCAB, seed=4)
    roots, prefix = inputs(4)
    policy = make_policy("static-tree", CFG)
    state = policy.start(roots)
    while not state.done:
        policy.advance(state, SyntheticDrafter(world).propose(state.frontier(), policy.children_per_node))
    policy.select(state)
    full, cut = pad_pool(state.pool, prefix, CFG.total_tokens), pad_pool(state.pool, prefix, 5)
    assert_same(
        cut, type(cut)(**{n: getattr(full, n)[:, :5] for n in PADDED if n != "mask"}, mask=full.mask[:, :5, :5]), PADDED
    )
    assert bool((cut.parents < torch.arange(5)).all())  # every parent is inside the cut


def test_a_builder_is_freed_without_the_cyclic_gc():
    """No reference cycle: a dead builder's graphs go when it does, never in a later collection,
    which could run in the middle of another builder's capture and invalidate it."""
    builder = GraphedTreeBuilder(
        make_policy("echo", CFG),
        SyntheticDrafter(SyntheticWorld(B, vocab=VOCAB)),
        B,
        max_tree_size("echo", CFG),
        "cpu",
        finish=dense_from_padded,
    )
    builder(*inputs(0))
    alive = weakref.ref(builder)
    gc.disable()
    try:
        del builder
        assert alive() is None
    finally:
        gc.enable()


def test_refuses_a_policy_whose_choices_are_not_in_select():
    class Wrapped(TreePolicy):
        def advance(self, state, cands):
            pass

        def finish(self, state):
            return state.pool.compact()

    with pytest.raises(TypeError, match="select"):
        GraphedTreeBuilder(Wrapped(), None, B, 4, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "name, stop_early, compile",
    [
        *((name, stop_early, None) for name in POLICIES for stop_early in (True, False)),
        ("echo", True, "inductor"),  # Inductor: two policies are enough (seconds of compilation per stage)
        ("static-tree", True, "inductor"),
    ],
)
def test_cuda_graph_replay_equals_eager(name, stop_early, compile):
    world = SyntheticWorld(B, vocab=VOCAB, seed=5, device="cuda")
    width = max_tree_size(name, CFG)
    graphed = GraphedTreeBuilder(
        make_policy(name, CFG),
        SyntheticDrafter(world),
        B,
        width,
        "cuda",
        finish=dense_from_padded,
        stop_early=stop_early,
        compile=compile,
    )
    for seed in range(5):  # the first call captures, the rest replay
        roots, prefix = inputs(seed, "cuda")
        trees, _ = build_trees(make_policy(name, CFG), SyntheticDrafter(world), roots)
        assert_same(graphed(roots, prefix), to_sglang_dense(trees, prefix, width), DENSE)
    assert len(graphed._graphs) == graphed.policy.max_depth + 2  # start, one per depth, end


def test_candidate_buffers_on_the_cpu():
    """The graphs' input path without CUDA: each depth's candidates are copied into one buffer
    per field (cast to the buffer's dtype), the stages read only those, and a drafter whose
    candidates change shape after the first step is refused with the depth and field named."""
    world = SyntheticWorld(B, vocab=VOCAB, seed=9)
    width = max_tree_size("echo", CFG)
    builder = GraphedTreeBuilder(make_policy("echo", CFG), SyntheticDrafter(world), B, width, "cpu", graphs=True)
    for seed in range(3):  # _step is what the capture's warm-up and every replay run around the graphs
        roots, prefix = inputs(seed)
        builder.roots.copy_(roots)
        builder.prefix_lens.copy_(prefix)
        out = builder._step(stop_early=False)
        trees, _ = build_trees(make_policy("echo", CFG), SyntheticDrafter(world), roots)
        assert_same(out, pad_trees(trees, prefix, width), PADDED)
    buffers = [c.tokens.data_ptr() for c in builder._cands[1:]]

    class Narrower(SyntheticDrafter):
        def propose(self, frontier, k):
            return SyntheticDrafter.propose(self, frontier, k - 1)

    builder._step(stop_early=False)
    assert [c.tokens.data_ptr() for c in builder._cands[1:]] == buffers  # copied into, never replaced
    builder.drafter = Narrower(world)
    with pytest.raises(ValueError, match="depth 1: the drafter's tokens changed shape"):
        builder._step(stop_early=False)
