"""ECHO with the DART drafter (``drafter: dart``) in real sglang servers on the CPU platform.

SmolLM2-135M (float32) with the shipped DART head and its n-gram trie:

* every serving policy (``beam-tree`` is the calibration probe; ``ar`` drafts nothing) is
  lossless: greedy outputs equal a no-speculation server's token for token, 8 staggered
  concurrent requests, ``K_max`` binding, and drafts get accepted (the policies beyond echo /
  chain / static-tree: see :func:`.conftest.matrix`);
* DART's n-gram pruning off (``dart_ngram: false``) is lossless too;
* the server drafts what the offline DART drafter drafts: one request at a time under the chain
  policy, each request's accepted drafts equal :func:`sglang_echo.eval.loop.speculative_generate`
  with :class:`~sglang_echo.drafters.dart.DartDrafter` (HF target), so sglang's draft extend plus
  :meth:`LlamaForCausalLMDart.mask_logits` compute DART's marginals (a wrong mask forward would
  stay lossless but accept different drafts);
* the server refuses a DART head under another drafter and a non-DART head under ``dart``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sglang_echo.serve.client import Generation, generate

from ._server_args_probe import probe
from .conftest import SPEC, WORKERS, matrix, run_staggered, scrape, start

K_MAX = 12  # < 8 requests x 7 slots: the budget binds whenever >= 2 requests are running
DART = {"SGLANG_ECHO_DRAFTER": "dart"}
BUDGETED = ("echo", "budgeted-chain", "dense-gating", "fixed-threshold")

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def dart_head(smollm2_dir) -> Path:
    from sglang_echo.models.drafts import SMOLLM2_DART, stage_head

    return stage_head(smollm2_dir, SMOLLM2_DART)


@pytest.fixture(scope="module")
def prompt_ids(smollm2_prompts) -> list[list[int]]:
    return smollm2_prompts[:8]  # 2 per prompt set


@pytest.fixture(scope="module")
def reference(smollm2_reference) -> list[Generation]:
    return smollm2_reference[:8]


def serve(policy: str, smollm2_dir: Path, dart_head: Path, prompt_ids, *, env: dict | None = None,
          one_by_one: int = 0) -> tuple[list[Generation], dict, list[Generation]]:
    """Staggered greedy generations, the metrics, and ``one_by_one`` prompts served alone."""
    env = {**DART, "SGLANG_ECHO_POLICY": policy, "SGLANG_ECHO_K_MAX": str(K_MAX), **(env or {})}
    srv = start(smollm2_dir, spec="echo", draft=dart_head, env=env, tag=f"dart-{policy}")
    try:
        got = run_staggered(srv.base_url, prompt_ids)
        metrics = scrape(srv.base_url)
        alone = [generate(srv.base_url, input_ids=ids, max_new_tokens=32) for ids in prompt_ids[:one_by_one]]
        alive = srv.alive()
    finally:
        srv.stop()
    assert alive
    return got, metrics, alone


def check_lossless(policy: str, got: list[Generation], want: list[Generation], metrics: dict) -> None:
    mismatches = [(i, w.output_ids, g.output_ids) for i, (w, g) in enumerate(zip(want, got)) if w.output_ids != g.output_ids]
    assert not mismatches, f"dart/{policy}: {len(mismatches)}/{len(got)} outputs differ, first: {mismatches[0]}"
    assert metrics["echo_budget_exceeded_total"] == 0 and metrics["echo_steps_total"] > 0
    if policy in BUDGETED:
        assert metrics["echo_step_verified_tokens_max"] <= max(K_MAX, WORKERS)
    for g in got:
        hist = g.meta.get("spec_cap_lens_histogram") or []
        assert sum(hist) == g.meta["spec_verify_ct"] > 0 and len(hist) <= SPEC.num_draft_tokens + 1
    correct = sum(g.meta["spec_num_correct_drafts"] for g in got)
    tokens = sum(g.meta["completion_tokens"] for g in got)
    steps = sum(g.meta["spec_verify_ct"] for g in got)
    print(f"[dart/{policy}] tokens={tokens} verify_steps={steps} accepted_drafts={correct} "
          f"accept_len={tokens / max(steps, 1):.2f}")
    assert correct > 0 and steps < tokens


def offline_correct_drafts(smollm2_dir: Path, dart_head: Path, prompts: list[list[int]], depth: int) -> tuple[list[int], int]:
    """Accepted drafts per request of the offline loop, one request at a time, chain of ``depth``,
    and the most drafts any step accepted."""
    from sglang_echo.core.baselines import Chain
    from sglang_echo.drafters.dart import load_dart_drafter
    from sglang_echo.eval.loop import speculative_generate
    from sglang_echo.eval.target import HFTarget

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32, attn_implementation="sdpa")
    drafter = load_dart_drafter(dart_head, model.get_input_embeddings().weight, model.config.num_hidden_layers)
    target = HFTarget(model, drafter.captured_layers)
    out, deepest = [], 0
    for ids in prompts:
        res = speculative_generate(target, drafter, Chain(depth), [torch.tensor(ids)], max_new_tokens=32)
        out.append(sum(max(int(a[0]), 0) for a in res.accept_len))
        deepest = max([deepest] + [int(a[0]) for a in res.accept_len])
    return out, deepest


def test_dart_echo_lossless_and_drafts_match_offline(smollm2_dir, dart_head, prompt_ids, reference):
    got, metrics, _ = serve("echo", smollm2_dir, dart_head, prompt_ids)
    check_lossless("echo", got, reference, metrics)
    assert sum(v for k, v in metrics.items() if k.startswith("echo_gate_evaluated_total[")) > 0


def test_dart_chain_drafts_what_offline_dart_drafts(smollm2_dir, dart_head, prompt_ids, reference):
    got, metrics, alone = serve("chain", smollm2_dir, dart_head, prompt_ids, one_by_one=4)
    check_lossless("chain", got, reference, metrics)
    server = [g.meta["spec_num_correct_drafts"] for g in alone]
    offline, deepest = offline_correct_drafts(smollm2_dir, dart_head, prompt_ids[:4], SPEC.num_steps)
    print(f"[dart/chain] accepted drafts per request: server {server}, offline {offline}; deepest step {deepest}")
    assert server == offline
    assert deepest >= 2  # drafts from the mask positions (depth >= 2) were accepted, so they were compared


@pytest.mark.parametrize("policy", ["static-tree"])
def test_dart_baseline_lossless(policy, smollm2_dir, dart_head, prompt_ids, reference):
    got, metrics, _ = serve(policy, smollm2_dir, dart_head, prompt_ids)
    check_lossless(policy, got, reference, metrics)


@pytest.mark.parametrize("policy", matrix("dart", ("dense-gating", "fixed-threshold", "budgeted-chain")))  # ar drafts nothing
def test_dart_policy_matrix(policy, smollm2_dir, dart_head, prompt_ids, reference):
    got, metrics, _ = serve(policy, smollm2_dir, dart_head, prompt_ids,
                            env={"SGLANG_ECHO_CONFIG": json.dumps({"fixed_tau": 0.2})} if policy == "fixed-threshold" else None)
    check_lossless(policy, got, reference, metrics)


@pytest.mark.echo_matrix
def test_dart_without_ngram_pruning_lossless(smollm2_dir, dart_head, prompt_ids, reference):
    got, metrics, _ = serve("echo", smollm2_dir, dart_head, prompt_ids, env={"SGLANG_ECHO_DART_NGRAM": "0"})
    check_lossless("echo/no-ngram", got, reference, metrics)


def test_server_args_refuse_a_mismatched_head(smollm2_dir, dart_head, tmp_path):
    """sglang's parser + ECHO's validation in a fresh process with the CPU engine."""
    from sglang_echo.models.drafts import stage_head

    base = ["--model-path", str(smollm2_dir), "--device", "cpu", "--attention-backend", "echo_torch",
            "--speculative-algorithm", "ECHO", "--speculative-draft-model-path"]
    cases = {
        "dart_head_as_eagle3": {"argv": base + [str(dart_head)]},
        "eagle3_head_as_dart": {"argv": base + [str(stage_head(smollm2_dir))], "env": DART},
        "dart": {"argv": base + [str(dart_head)], "env": DART},
    }
    r = probe(cases, tmp_path)
    assert "is a DART head: set the ECHO drafter to 'dart'" in r["dart_head_as_eagle3"]["error"]
    assert "drafter 'dart' needs a DART head" in r["eagle3_head_as_dart"]["error"]
    assert r["dart"]["speculative_algorithm"] == "ECHO", r["dart"]

