"""ECHO with the DART drafter (``drafter: dart``) in real sglang servers on the CPU platform.

SmolLM2-135M (float32) with the shipped DART head and its n-gram trie:

* every serving policy (``beam-tree`` is the calibration probe; ``ar`` drafts nothing) is
  lossless: greedy outputs equal a no-speculation server's token for token, 8 staggered
  concurrent requests, ``K_max`` binding, and drafts get accepted (the policies beyond echo /
  chain / static-tree: see :func:`.conftest.matrix`);
* DART's n-gram pruning off (``dart_ngram: false``) is lossless too (the fixed-threshold server);
* the server drafts what the offline DART drafter drafts: one request at a time under the chain
  policy, each request's accepted drafts equal :func:`sglang_echo.eval.loop.speculative_generate`
  with :class:`~sglang_echo.drafters.dart.DartDrafter` (HF target), so sglang's draft extend plus
  :meth:`LlamaForCausalLMDart.mask_logits` compute DART's marginals (a wrong mask forward would
  stay lossless but accept different drafts).

The server's refusal of a DART head under another drafter: ``test_server_args``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_echo.serve.client import Generation

from .conftest import SPEC, matrix
from .drafter_servers import DrafterSuite


def _offline_dart(model, head: Path):
    from sglang_echo.drafters.dart import load_dart_drafter

    return load_dart_drafter(head, model.get_input_embeddings().weight, model.config.num_hidden_layers)


SUITE = DrafterSuite("dart", _offline_dart)

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


def test_dart_echo_lossless_and_drafts_match_offline(smollm2_dir, dart_head, prompt_ids, reference):
    got, metrics, _ = SUITE.serve("echo", smollm2_dir, dart_head, prompt_ids)
    SUITE.check_lossless("echo", got, reference, metrics)
    assert sum(v for k, v in metrics.items() if k.startswith("echo_gate_evaluated_total[")) > 0


def test_dart_hybrid_lossless(smollm2_dir, dart_head, prompt_ids, reference):
    """`hybrid` (what `make serve` runs on a CPU): the DART head and each request's n-gram drafter
    in one tree; n-gram nodes drafted, output plain decoding's."""
    got, metrics, _ = SUITE.serve("echo", smollm2_dir, dart_head, prompt_ids, env={"SGLANG_ECHO_HYBRID": "1"})
    SUITE.check_lossless("echo/hybrid", got, reference, metrics)
    assert metrics.get("echo_hybrid_ngram_nodes_total", 0) > 0


def test_dart_chain_drafts_what_offline_dart_drafts(smollm2_dir, dart_head, prompt_ids, reference):
    got, metrics, alone = SUITE.serve("chain", smollm2_dir, dart_head, prompt_ids, one_by_one=4)
    SUITE.check_lossless("chain", got, reference, metrics)
    server = [g.meta["spec_num_correct_drafts"] for g in alone]
    offline, deepest = SUITE.offline_correct_drafts(smollm2_dir, dart_head, prompt_ids[:4], SPEC.num_steps)
    print(f"[dart/chain] accepted drafts per request: server {server}, offline {offline}; deepest step {deepest}")
    assert server == offline
    assert deepest >= 2  # drafts from the mask positions (depth >= 2) were accepted, so they were compared


@pytest.mark.parametrize("policy", ["static-tree"])
def test_dart_baseline_lossless(policy, smollm2_dir, dart_head, prompt_ids, reference):
    got, metrics, _ = SUITE.serve(policy, smollm2_dir, dart_head, prompt_ids)
    SUITE.check_lossless(policy, got, reference, metrics)


# fixed-threshold runs without the n-gram pruning (DART's plain per-position top-k tree): the
# default matrix covers both tree builders without a server of its own for the second.
NO_NGRAM = {"fixed-threshold": {"SGLANG_ECHO_CONFIG": json.dumps({"fixed_tau": 0.2}), "SGLANG_ECHO_DART_NGRAM": "0"}}


@pytest.mark.parametrize(
    "policy", matrix("dart", ("dense-gating", "fixed-threshold", "budgeted-chain"))
)  # ar drafts nothing
def test_dart_policy_matrix(policy, smollm2_dir, dart_head, prompt_ids, reference):
    env = NO_NGRAM.get(policy)
    got, metrics, _ = SUITE.serve(policy, smollm2_dir, dart_head, prompt_ids, env=env)
    SUITE.check_lossless(policy + ("/no-ngram" if env else ""), got, reference, metrics)
