"""ECHO with the parameter-free n-gram drafter (``drafter: ngram``, no draft model).

Offline (no server): the per-request drafter state catches up incrementally exactly as a fresh
drafter would; the trees every core policy builds come out in NGRAM's padded layout; and a
greedy verify loop over that layout (sglang's acceptance rule, on a toy target) reproduces plain
decoding while requests join and leave. The worker's sglang hooks (compat rows, the copied
``NGRAMWorker.__init__``) match the installed sglang (its server args: ``test_server_args``).

Servers (``server`` mark; SmolLM2, CPU, float32): ``--speculative-algorithm ECHO`` with the
n-gram drafter serves with no draft model, and its greedy outputs equal a no-speculation
server's token for token with 8 staggered concurrent requests, for every core policy: ``echo``
(calibrated gates, K_max binding) on all 16 prompts, the baselines on 8 each. Every drafting
policy must get drafts accepted. ``echo_matrix`` (ar, dense-gating, fixed-threshold,
budgeted-chain): see :func:`.conftest.matrix`.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
import requests
import torch

from sglang_echo.core.factory import POLICIES
from sglang_echo.drafters.ngram import NGramDrafter
from sglang_echo.integration.config import load_config, make_echo_policy
from sglang_echo.integration.ngram_worker import (
    History,
    RequestDrafters,
    _WidthViews,
    build_ngram_drafts,
)
from sglang_echo.serve.client import Generation

from .conftest import WORKERS, matrix, result_in_scheduler, run_staggered, scrape
from .test_config import write_calibration

NGRAM = {"SGLANG_ECHO_DRAFTER": "ngram"}


# -- offline ------------------------------------------------------------------------------------
def _policy(name: str, k_max: int = 12):
    cfg = load_config(environ={**NGRAM, "SGLANG_ECHO_POLICY": name, "SGLANG_ECHO_K_MAX": str(k_max)})
    return make_echo_policy(cfg), cfg.resolved_width()


def _state(d: NGramDrafter) -> tuple:
    return d.history(0), {k: {t: tuple(v) for t, v in s.items()} for k, s in d._index[0].items()}


def test_incremental_catch_up_equals_a_fresh_drafter():
    rng = random.Random(0)
    rd = RequestDrafters()
    prompt = [rng.randrange(6) for _ in range(20)]
    out: list[int] = []
    for _ in range(30):
        out += [rng.randrange(6) for _ in range(rng.randrange(0, 4))]  # 0..3 accepted tokens a step
        got = rd.sync("r", History(prompt, out))
        fresh = RequestDrafters().sync("r", History(prompt + out, []))
        assert _state(got) == _state(fresh)
    assert rd.rebuilds == 0
    # A history that does not extend what the drafter holds (retracted, rid reused) is rebuilt.
    got = rd.sync("r", History(prompt, [5, 5, 5]))
    assert rd.rebuilds == 1 and got.history(0) == prompt + [5, 5, 5]
    rd.erase_match_state(["r", "unknown"])
    assert "r" not in rd and len(rd) == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_trees_in_ngram_layout(policy):
    """Real nodes first (root, topologically ordered, ancestor-closed mask), padding after them
    (root token, diagonal-only row, seen by nobody); every node's children are distinct tokens."""
    pol, W = _policy(policy)
    rd = RequestDrafters()
    hists = [History([1, 2, 3, 4, 1, 2, 3, 5, 1, 2], [3]), History([7, 8, 9], [7]), History([4] * 12, [4])]
    drafters = [rd.sync(str(i), h) for i, h in enumerate(hists)]
    roots = torch.tensor([h[-1] for h in hists])
    tokens, mask, step = build_ngram_drafts(pol, drafters, roots, W)
    B = len(hists)
    assert tokens.shape == (B * W,) and mask.shape == (B * W * W,) and mask.dtype == bool
    tokens, mask = tokens.reshape(B, W), torch.from_numpy(mask.reshape(B, W, W))
    sizes = step.sizes.tolist()
    for b in range(B):
        K = sizes[b]
        assert tokens[b, 0] == roots[b] and 1 <= K <= W
        m = mask[b]
        assert bool(m.diagonal().all()) and not bool(m.triu(1).any())  # ancestors precede
        strict = m & ~torch.eye(W, dtype=torch.bool)
        assert not bool(strict[:, K:].any())  # padding is nobody's ancestor ...
        assert not bool(strict[K:].any()) and (tokens[b, K:] == int(roots[b])).all()  # ... nor has any
        assert bool(m[1:K, 0].all())  # every real node descends from the root
        children: dict[int, list[int]] = {}
        for j in range(1, K):
            parent = int(torch.nonzero(m[j, :j]).max())
            assert bool((m[j, :j] == m[parent, :j]).all()) and bool(m[parent, parent])  # closed
            children.setdefault(parent, []).append(int(tokens[b, j]))
        assert all(len(c) == len(set(c)) for c in children.values())
    if policy == "ar":
        assert sizes == [1] * B
    else:  # the periodic histories always have a continuation
        assert sizes[0] > 1 and sizes[2] > 1
    if pol.budgeted:
        assert sum(sizes) <= max(12, B)


@pytest.mark.parametrize("policy", ["echo", "ar"])
def test_per_step_width_keeps_the_trees_and_drops_the_padding(policy):
    """``per_step_width``: the same trees, laid out ``max K_i`` wide (``ar``: one slot each), and
    NGRAM's buffer views follow that width."""
    pol, W = _policy(policy)
    rd = RequestDrafters()
    hists = [History([1, 2, 3, 4, 1, 2, 3, 5, 1, 2], [3]), History([7, 8, 9], [7]), History([4] * 12, [4])]
    roots = torch.tensor([h[-1] for h in hists])
    wide = build_ngram_drafts(pol, [rd.sync(f"w{i}", h) for i, h in enumerate(hists)], roots, W)
    tokens, mask, step = build_ngram_drafts(
        pol, [rd.sync(f"n{i}", h) for i, h in enumerate(hists)], roots, W, per_step_width=True
    )
    B, Ws = len(hists), int(step.sizes.max())
    assert step.width == Ws and wide[2].width == W and step.sizes.tolist() == wide[2].sizes.tolist()
    assert Ws == 1 if policy == "ar" else 1 < Ws < W
    assert (tokens.reshape(B, Ws) == wide[0].reshape(B, W)[:, :Ws]).all()
    assert (mask.reshape(B, Ws, Ws) == wide[1].reshape(B, W, W)[:, :Ws, :Ws]).all()
    links, mask_buf = torch.arange(4 * W).view(4, W), torch.arange(4 * W * W)  # NGRAM's [max_bs, W], [max_bs*W*W]
    assert _WidthViews(links, (Ws,))[3].tolist() == torch.arange(3 * Ws).view(3, Ws).tolist()
    assert _WidthViews(mask_buf, (), Ws * Ws)[2].tolist() == list(range(2 * Ws * Ws))


def _greedy_walk(tokens, nxt, sib, target_next):
    """sglang's verify_tree_greedy on one request: accepted draft tokens, then the bonus."""
    out, last = [], 0
    while True:
        want, cur = target_next(out), int(nxt[last])
        while cur != -1 and int(tokens[cur]) != want:
            cur = int(sib[cur])
        if cur == -1:
            return out + [want]
        out.append(want)
        last = cur


@pytest.mark.parametrize("policy", ["echo", "static-tree", "budgeted-chain"])
def test_greedy_verify_loop_is_lossless(policy):
    """Draft with ECHO trees in NGRAM's layout, derive the retrieve links with the platform's
    ``reconstruct_indices_from_tree_mask`` (the op NGRAM calls), accept greedily against a toy
    deterministic target, and compare with plain decoding; requests join and leave the batch."""
    from sglang_echo.platform.ops.spec_tree import reconstruct_indices_from_tree_mask

    def target(seq):  # a deterministic "model" with long repeats: next = f(last 3 tokens)
        return (seq[-1] * 3 + seq[-2] + (seq[-3] % 2)) % 11 if len(seq) >= 3 else 1

    pol, W = _policy(policy)
    rd = RequestDrafters()
    rng = random.Random(1)
    prompts = {f"r{i}": [rng.randrange(11) for _ in range(8)] for i in range(6)}
    want = {}
    for rid, p in prompts.items():
        seq = list(p)
        for _ in range(40):
            seq.append(target(seq))
        want[rid] = seq[len(p) :]
    out = {rid: [want[rid][0]] for rid in prompts}  # the prefill's token
    live, waiting, accepted = [], list(prompts), 0
    while live or waiting:
        if waiting and (not live or rng.random() < 0.5):
            live.append(waiting.pop(0))
        hists = [History(prompts[r], out[r]) for r in live]
        drafters = [rd.sync(r, h) for r, h in zip(live, hists)]
        tokens, mask, step = build_ngram_drafts(pol, drafters, torch.tensor([h[-1] for h in hists]), W)
        B = len(live)
        pos, ri = torch.zeros(B * W, dtype=torch.int64), torch.zeros(B, W, dtype=torch.int64)
        nxt, sib = torch.zeros(B, W, dtype=torch.int64), torch.zeros(B, W, dtype=torch.int64)
        seq_lens = torch.tensor([len(h) - 1 for h in hists])
        reconstruct_indices_from_tree_mask(torch.from_numpy(mask), seq_lens, pos, ri, nxt, sib, B, W)
        tokens = tokens.reshape(B, W)
        for b, r in enumerate(live):
            # Positions are seq_len + depth; padding sits at depth 0.
            depth = pos.view(B, W)[b] - seq_lens[b]
            assert int(depth[0]) == 0 and bool((depth[int(step.sizes[b]) :] == 0).all())
            ctx = prompts[r] + out[r]
            new = _greedy_walk(tokens[b], nxt[b], sib[b], lambda acc, ctx=ctx: target(ctx + acc))
            accepted += len(new) - 1
            out[r] = (out[r] + new)[: len(want[r])]
        for r in [r for r in live if len(out[r]) >= len(want[r])]:
            live.remove(r)
            rd.erase_match_state([r])
    assert out == want
    assert accepted > 0


def test_hooks_and_init_match_installed_sglang():
    """The ngram rows of the compat table and the re-implemented NGRAMWorker.__init__ (its
    attribute list, compat.MIRRORS), checked where sglang's kernels import (the CPU engine shims
    them, as in the scheduler); EchoNgramWorker.__init__ sets every attribute sglang's sets."""
    code = (
        "from sglang_echo.integration import compat; "
        "from sglang_echo.integration import ngram_worker as m; "
        "import sglang.srt.speculative.ngram_worker; "
        "w = m.EchoNgramWorker; from sglang.srt.speculative.ngram_worker import NGRAMWorker; "
        "assert issubclass(w, NGRAMWorker); "
        "missing = compat.NGRAM_WORKER_INIT_ATTRS - compat.assigned_attrs(w.__init__); "
        "print('RESULT', compat.check_hooks(), sorted(missing))"
    )
    assert result_in_scheduler(code) == "[] []"


# -- servers ------------------------------------------------------------------------------------
K_MAX = 12  # < 8 requests x 7 slots: the budget binds whenever >= 2 requests are running
FEW = 8  # prompts for the baselines (2 per prompt set)
ELASTIC = ("echo", "dense-gating", "fixed-threshold")


@pytest.fixture(scope="module")
def prompt_ids(smollm2_prompts) -> list[list[int]]:
    return smollm2_prompts


@pytest.fixture(scope="module")
def reference(smollm2_reference) -> list[Generation]:
    return smollm2_reference


def _start(model: Path, *, spec: str = "none", env: dict | None = None, tag: str = ""):
    from ..conftest import INTEGRATION_PORTS, launch_test_server

    return launch_test_server(
        INTEGRATION_PORTS,
        f"ngram-echo-{tag or spec}",
        model_path=model,
        spec=spec,
        dtype="float32",
        enable_metrics=spec != "none",
        max_total_tokens=8192,
        context_length=1024,
        extra_env=tuple(sorted((env or {}).items())),
    )


def run_policy(policy: str, smollm2_dir: Path, prompt_ids, reference, tmp_path_factory, n: int, faults: str = ""):
    from sglang_echo.core.calibration_file import fingerprint
    from sglang_echo.integration.served_calibration import drafter_fingerprint

    env = {**NGRAM, "SGLANG_ECHO_POLICY": policy, "SGLANG_ECHO_K_MAX": str(K_MAX), "SGLANG_ECHO_FAULT_INJECT": faults}
    if policy in ELASTIC:
        calib = tmp_path_factory.mktemp("calib") / "calibration.json"
        # Gates at depths 1 and 2 that some n-gram proposals pass and some fail.
        env["SGLANG_ECHO_CALIBRATION"] = str(
            write_calibration(
                calib,
                model_fp=fingerprint(smollm2_dir),
                drafter_fp=drafter_fingerprint("ngram"),
                thresholds=(0.3, 0.15),
                kind="ngram",
            )
        )
    if policy == "fixed-threshold":
        env["SGLANG_ECHO_CONFIG"] = json.dumps({"fixed_tau": 0.2})
    if policy == "static-tree":  # the drafter named in the JSON config rather than its env var
        del env["SGLANG_ECHO_DRAFTER"]
        env["SGLANG_ECHO_CONFIG"] = json.dumps({"drafter": "ngram"})
    inputs, want = prompt_ids[:n], reference[:n]
    t0 = time.time()
    srv = _start(smollm2_dir, spec="echo", env=env, tag=policy)
    try:
        got = run_staggered(srv.base_url, inputs)
        metrics = scrape(srv.base_url)
        info = requests.get(srv.base_url + "/server_info", timeout=30).json()
        alive = srv.alive()
    finally:
        srv.stop()
    assert alive
    mismatches = [
        (i, w.output_ids, g.output_ids) for i, (w, g) in enumerate(zip(want, got)) if w.output_ids != g.output_ids
    ]
    assert not mismatches, f"{policy}: {len(mismatches)}/{len(got)} outputs differ, first: {mismatches[0]}"

    assert info["speculative_algorithm"] == "ECHO" and not info.get("speculative_draft_model_path")
    W = info["speculative_num_draft_tokens"]
    correct = sum(g.meta["spec_num_correct_drafts"] for g in got)
    tokens = sum(g.meta["completion_tokens"] for g in got)
    steps = sum(g.meta["spec_verify_ct"] for g in got)
    for g in got:
        hist = g.meta.get("spec_cap_lens_histogram") or []
        assert sum(hist) == g.meta["spec_verify_ct"] > 0  # cap_lens = K_i reported every step
        assert len(hist) <= W + 1  # K_i <= W
    assert metrics["echo_budget_exceeded_total"] == 0 and metrics["echo_steps_total"] > 0
    # Verify slots: batch x the step's width, here (ragged, no overlap) max K_i, not W.
    verified, slots = metrics["echo_verified_tokens_total"], metrics["echo_verify_slots_total"]
    assert verified <= slots <= W * verified
    if policy == "ar":  # no drafts: one slot per request and step as in plain decoding, not W
        assert slots == verified
    if policy in ("echo", "budgeted-chain", "dense-gating", "fixed-threshold"):  # budgeted
        assert metrics["echo_step_verified_tokens_max"] <= max(K_MAX, WORKERS)
    if policy in ELASTIC:
        assert sum(v for k, v in metrics.items() if k.startswith("echo_gate_evaluated_total[")) > 0
    print(
        f"[ngram/{policy}] {len(got)} prompts, {time.time() - t0:.0f}s: tokens={tokens} verify_steps={steps} "
        f"accepted_drafts={correct} accept_len={tokens / max(steps, 1):.2f} "
        f"verified_per_step={metrics['echo_verified_tokens_total'] / metrics['echo_steps_total']:.2f}"
    )
    if policy == "ar":  # drafts nothing: every request verifies its root alone
        assert correct == 0 and all(g.meta.get("spec_cap_length", 1.0) == 1.0 for g in got)
    else:  # the drafter proposes and the target accepts: fewer verify steps than tokens
        assert correct > 0 and steps < tokens
    return metrics


@pytest.mark.server
def test_echo_ngram_lossless_on_every_prompt(smollm2_dir, prompt_ids, reference, tmp_path_factory):
    """With a fault drill (the n-gram drafters raise in the 2nd drafting step, propose an
    out-of-vocabulary token in the 5th): those steps are plain decoding, every output is exact."""
    metrics = run_policy(
        "echo", smollm2_dir, prompt_ids, reference, tmp_path_factory, n=len(prompt_ids), faults="raise:2,garbage:5"
    )
    assert metrics["echo_draft_faults_total[raise]"] == 1 and metrics["echo_draft_faults_total[garbage]"] == 1


@pytest.mark.server
@pytest.mark.parametrize("policy", ["chain", "static-tree"])
def test_ngram_baseline_lossless(policy, smollm2_dir, prompt_ids, reference, tmp_path_factory):
    run_policy(policy, smollm2_dir, prompt_ids, reference, tmp_path_factory, n=FEW)


@pytest.mark.server
@pytest.mark.parametrize("policy", matrix("ngram"))
def test_ngram_full_policy_matrix(policy, smollm2_dir, prompt_ids, reference, tmp_path_factory):
    run_policy(policy, smollm2_dir, prompt_ids, reference, tmp_path_factory, n=FEW)
