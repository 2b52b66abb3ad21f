"""Simulated acceptance (``SGLANG_ECHO_SIMULATE``, integration/simulate.py): start-up checks, the
hooks sglang calls, and a real ECHO server on random weights that accepts exactly what the
recorded SmolLM2 + EAGLE-3 pair accepted."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from sglang_echo.core.policy import Frontier
from sglang_echo.core.tree import Candidates
from sglang_echo.integration import simulate
from sglang_echo.integration.simulate import (
    ENV,
    FORCED_LOGIT,
    Simulation,
    SimulationError,
    force_tokens,
    target_forward_hook,
    verify_sample_hook,
)
from sglang_echo.replay.trace import Trace, TraceMeta

from ..conftest import INTEGRATION_PORTS
from ..replay.server_check import record_then_validate

PROMPT, OUTPUT = [11, 12, 13], [21, 22, 23, 24, 25]
# Every recorded tree (root o_s, s = 0, 1): the true child o_{s+1} (expanded: o_{s+2} and a wrong
# one) and a wrong sibling, with their drafter log-probabilities, in BFS order.
TREE = {
    "parent": [-1, 0, 0, 1, 1],
    "depth": [0, 1, 1, 2, 2],
    "logprob": [0.0, -0.1, -2.0, -0.2, -2.5],
    "first_child": [1, 3, -1, -1, -1],
    "n_kept": [2, 2, 0, 0, 0],
    "n_avail": [2, 2, -1, -1, -1],
}


def _tokens(s):
    return [OUTPUT[s], OUTPUT[s + 1], 90 + s, OUTPUT[s + 2], 80 + s]


def _save_trace(path, *, vocab_size=None, fingerprints=None):
    """One stream (prompt 11 12 13, continuation 21 .. 25), a depth-2 tree at o_0 and o_1."""
    meta = TraceMeta(
        fingerprints=fingerprints or {},
        drafter="eagle3",
        target="/models/SmolLM2",
        max_new=3,
        depth=2,
        width=2,
        beams=[1],
        max_nodes=5,
        vocab_size=vocab_size,
    )
    n, T = len(TREE["parent"]), 2
    i64 = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
    nodes = {k: (torch.tensor(v * T) if k == "logprob" else i64(v * T)) for k, v in TREE.items()}
    Trace(
        meta=meta,
        prompt_indptr=i64([0, 3]),
        prompt_tokens=i64(PROMPT),
        output_indptr=i64([0, len(OUTPUT)]),
        output_tokens=i64(OUTPUT),
        tree_indptr=i64([0, T]),
        node_indptr=i64([0, n, 2 * n]),
        token=i64(_tokens(0) + _tokens(1)),
        **nodes,
    ).save(path)
    return path


@pytest.fixture
def trace_stem(tmp_path):
    return _save_trace(tmp_path / "t", vocab_size=100)


@pytest.fixture
def sim(trace_stem, monkeypatch):
    monkeypatch.setenv(ENV, str(trace_stem))
    yield simulate.start("eagle3", 100, "cpu")
    simulate._ACTIVE = None


def test_no_variable_no_simulation(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert simulate.start("eagle3", 100, "cpu") is None and simulate.active() is None
    hooks = []
    simulate.register(SimpleNamespace(register=lambda *a: hooks.append(a)), "around")
    assert hooks == []


def test_the_variable_registers_both_hooks(monkeypatch, trace_stem):
    monkeypatch.setenv(ENV, str(trace_stem))
    hooks = []
    simulate.register(SimpleNamespace(register=lambda *a: hooks.append(a)), "around")
    assert [(t, h) for t, h, _ in hooks] == [
        (simulate.VERIFY_SAMPLE, verify_sample_hook),
        (simulate.TARGET_FORWARD, target_forward_hook),
    ]


@pytest.mark.parametrize(
    "case, match",
    [
        ("missing", "no trace there"),
        ("garbage", "not a readable trace"),
        ("vocab", r"vocabulary \(100 ids\) is larger than this target's \(50\)"),
        ("drafter", "SGLANG_ECHO_DRAFTER=eagle3"),
    ],
)
def test_start_up_refusals_name_the_setting(case, match, tmp_path, trace_stem, monkeypatch):
    stem, drafter, vocab = trace_stem, "eagle3", 100
    if case == "missing":
        stem = tmp_path / "nowhere"
    elif case == "garbage":
        (tmp_path / "t.json").write_text(json.dumps({"schema": "something else"}))
    elif case == "vocab":
        vocab = 50
    else:
        drafter = "dart"
    monkeypatch.setenv(ENV, str(stem))
    with pytest.raises(SimulationError, match=match) as e:
        simulate.start(drafter, vocab, "cpu")
    assert ENV in str(e.value) and "\n" not in str(e.value)
    assert simulate.active() is None


def test_an_old_trace_needs_its_largest_id(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(_save_trace(tmp_path / "old")))  # no vocab_size recorded: ids up to 91
    with pytest.raises(SimulationError, match=r"\(92 ids\)"):
        simulate.start("eagle3", 91, "cpu")
    assert simulate.start("eagle3", 92, "cpu") is not None
    simulate._ACTIVE = None


def test_a_calibration_is_checked_against_the_traced_pair(tmp_path, monkeypatch):
    """The gates see the trace's confidences, so a simulating server (random weights, here a
    model path that does not exist) loads the calibration made for the recorded pair, refuses
    one made for another target, and one whose trace cannot say what it was recorded with."""
    from sglang_echo.core.calibration_file import CalibrationError
    from sglang_echo.integration.config import load_config
    from sglang_echo.integration.served_calibration import load_calibration_for

    from .test_config import write_calibration

    pair = {"model": "sha256:smollm2", "drafter": "sha256:head"}
    monkeypatch.setenv(ENV, str(_save_trace(tmp_path / "t", vocab_size=100, fingerprints=pair)))
    dummy = {"model_path": "/gpu/llama-3.1-8b", "draft_path": "/gpu/eagle3-llama-3.1-8b"}
    made_for = write_calibration(tmp_path / "c.json", model_fp=pair["model"], drafter_fp=pair["drafter"])
    assert load_calibration_for(load_config(environ={"SGLANG_ECHO_CALIBRATION": str(made_for)}), **dummy)
    other = write_calibration(tmp_path / "o.json", model_fp="sha256:other", drafter_fp=pair["drafter"])
    with pytest.raises(CalibrationError, match="made for a different model"):
        load_calibration_for(load_config(environ={"SGLANG_ECHO_CALIBRATION": str(other)}), **dummy)
    monkeypatch.setenv(ENV, str(_save_trace(tmp_path / "old", vocab_size=100)))
    with pytest.raises(CalibrationError, match="records no fingerprints of its target and head"):
        load_calibration_for(load_config(environ={"SGLANG_ECHO_CALIBRATION": str(made_for)}), **dummy)


def _batch(reqs, seq_lens, mode="decode"):
    return SimpleNamespace(
        reqs=reqs,
        seq_lens=torch.tensor(seq_lens),
        forward_mode=SimpleNamespace(is_idle=lambda: mode == "idle", is_extend=lambda: mode == "extend"),
    )


def _req(ids, rid="r"):
    return SimpleNamespace(rid=rid, origin_input_ids=list(ids))


def test_verify_hook_forces_the_trace_tokens_then_samples(sim):
    """Two requests, W = 3: the trace's request at root o_1 (position 4) and a stranger."""
    W, V = 3, 40
    verify_input = SimpleNamespace(draft_token_num=W, positions=torch.tensor([4, 5, 5, 7, 8, 9]))
    logits = torch.randn(2 * W, V)
    before = logits.clone()
    seen = {}

    def original(vi, batch, out, *args, **kwargs):
        seen["argmax"] = out.next_token_logits.argmax(-1).tolist()
        return "sampled"

    batch = _batch([_req(PROMPT), _req([1, 2], "stranger")], [4, 7])
    assert verify_sample_hook(original, verify_input, batch, SimpleNamespace(next_token_logits=logits)) == "sampled"
    # Position 4 holds o_1, so its node's next token is o_2; position 5's is o_3.
    assert seen["argmax"][:W] == [OUTPUT[2], OUTPUT[3], OUTPUT[3]]
    assert torch.equal(logits[W:], before[W:])  # the stranger keeps its own logits
    assert float(logits[0, OUTPUT[2]]) == FORCED_LOGIT


def test_verify_hook_refuses_without_an_echo_simulation(monkeypatch, trace_stem):
    monkeypatch.setenv(ENV, str(trace_stem))
    simulate._ACTIVE = None
    batch = _batch([_req(PROMPT)], [4])
    with pytest.raises(SimulationError, match="SGLANG_SIMULATE_ACC_LEN"):
        verify_sample_hook(lambda *a, **k: None, SimpleNamespace(), batch, SimpleNamespace())


def test_prefill_hook_forces_the_first_token_of_trace_requests_only(sim):
    target = SimpleNamespace(is_draft_worker=False)
    result = SimpleNamespace(next_token_ids=torch.tensor([7, 8, 9]))

    def original(worker, *args, **kwargs):
        return result

    # A finished prompt (length 3: o_0 next), a stranger, and a first chunk of the prompt (nothing to force).
    batch = _batch([_req(PROMPT), _req([5, 6, 7], "s"), _req(PROMPT, "chunk")], [3, 3, 2], mode="extend")
    target_forward_hook(original, target, batch)
    assert result.next_token_ids.tolist() == [OUTPUT[0], 8, 9]
    for worker, kwargs in ((SimpleNamespace(is_draft_worker=True), {}), (target, {"is_verify": True})):
        result.next_token_ids = torch.tensor([7, 8, 9])
        target_forward_hook(original, worker, batch, **kwargs)
        assert result.next_token_ids.tolist() == [7, 8, 9]


class DeviceJunk:
    """The EAGLE-3 frontier drafter's stand-in on ``device``: proposes token 7 everywhere."""

    def __init__(self, device):
        self.device, self.topk, self.forwards = device, 4, 0

    def propose(self, frontier, k):
        B, F = frontier.slots.shape
        self.forwards += 1
        dev = self.device
        return Candidates(
            tokens=torch.full((B, F * k), 7, device=dev),
            logprob=torch.zeros(B, F * k, device=dev),
            parent=torch.arange(F, device=dev).repeat_interleave(k).expand(B, F * k).contiguous(),
            valid=torch.ones(B, F * k, dtype=torch.bool, device=dev),
        )


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
        ),
    ],
)
def test_a_step_of_the_simulation_on_the_device(device, tmp_path):
    """A request at root o_1 and a stranger: the overlay serves the recorded children (the running
    drafter still runs), the forced logits make the trace's tokens the argmax; on a GPU without one
    host sync (torch's sync debug mode raises on any)."""
    dev = torch.device(device)
    sim = Simulation(Trace.load(_save_trace(tmp_path / "t")), "t", dev)
    reqs = [_req(PROMPT), _req([1, 2], "stranger")]
    batch = SimpleNamespace(reqs=reqs, seq_lens=torch.tensor([4, 2], device=dev))
    roots = torch.tensor([OUTPUT[1], 5], device=dev)
    frontier = Frontier(
        depth=0,
        slots=torch.zeros(2, 1, dtype=torch.int64, device=dev),
        source=torch.full((2, 1), -1, device=dev),
        tokens=roots[:, None],
        path_score=torch.zeros(2, 1, device=dev),
        active=torch.ones(2, dtype=torch.bool, device=dev),
    )
    positions = torch.tensor([[4, 5, 5], [2, 3, 3]], device=dev)
    logits = torch.randn(6, 100, device=dev)
    real = DeviceJunk(dev)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        drafter = sim.frontier(real, batch, roots)
        cands = drafter.propose(frontier, 2)
        force_tokens(logits, sim.streams.next_tokens(sim.streams.streams(reqs), positions).view(-1))
    finally:
        if dev.type == "cuda":
            torch.cuda.set_sync_debug_mode(0)
    assert real.forwards == 1 and drafter.forwards == 1
    assert cands.tokens[0].tolist() == [OUTPUT[2], 91] and cands.valid.tolist() == [[True, True], [False, False]]
    assert cands.logprob[0].tolist() == pytest.approx([-0.1, -2.0])
    assert logits.argmax(-1)[:3].tolist() == [OUTPUT[2], OUTPUT[3], OUTPUT[3]]
    assert (logits[3:] < FORCED_LOGIT).all()


# -- a real server ----------------------------------------------------------------------------------
@pytest.mark.server
def test_a_simulated_server_on_random_weights_accepts_what_smollm2_accepted(tmp_path):
    """A trace of SmolLM2 (float32) + its shipped EAGLE-3 head, then one ECHO server on SmolLM2's
    shape with random weights (``--load-format dummy``) in simulation mode: each trace prompt alone
    gives the recorded continuation, and sglang's per-request step count, accepted-draft and
    tree-size histograms equal the replay's. Random weights accept nothing of their own, so only
    a faithful simulation passes."""
    rows = record_then_validate(
        tmp_path,
        INTEGRATION_PORTS,
        ["--drafter", "eagle3", "--max-new-tokens", "24", "--depth", "4", "--width", "2", "--beams", "1,2"],
        [
            "--policies",
            "echo",
            "--k-max",
            "8",
            "--max-depth",
            "4",
            "--w-max",
            "2",
            "--simulate",
            "--load-format",
            "dummy",
        ],
    )
    assert len(rows) == 1 and rows[0]["simulated"] and rows[0]["exact"] and rows[0]["requests"] == 2
    assert rows[0]["steps"] < 2 * 23  # drafts were accepted: fewer steps than tokens
