"""ECHO with the DFlash drafter (``drafter: dflash``) in real sglang servers on the CPU platform.

SmolLM2-135M (float32) with the shipped DFlash head:

* echo, chain and static-tree (and the matrix policies, see :func:`.conftest.matrix`) are lossless:
  greedy outputs equal a no-speculation server's token for token, 8 staggered concurrent requests,
  ``K_max`` binding, and drafts get accepted;
* the server drafts what the offline DFlash drafter drafts: one request at a time under the chain
  policy, each request's accepted drafts equal :func:`sglang_echo.eval.loop.speculative_generate`
  with :class:`~sglang_echo.drafters.dflash.DFlashDrafter` (HF target), so the context the draft
  extends write into sglang's draft KV pool is DFlash's (a wrong context stays lossless but accepts
  different drafts).

The server's refusal of a DFlash head under another drafter: ``test_server_args``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_echo.serve.client import Generation

from .conftest import SPEC, matrix
from .drafter_servers import DrafterSuite


def _offline_dflash(model, head: Path):
    from sglang_echo.drafters.dflash import load_dflash_drafter

    return load_dflash_drafter(
        head, model.get_input_embeddings().weight, num_target_layers=model.config.num_hidden_layers
    )


SUITE = DrafterSuite("dflash", _offline_dflash)

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def dflash_head(smollm2_dir) -> Path:
    from sglang_echo.models.drafts import shipped_head

    return shipped_head(smollm2_dir, "dflash")


@pytest.fixture(scope="module")
def prompt_ids(smollm2_prompts) -> list[list[int]]:
    return smollm2_prompts[:8]  # 2 per prompt set


@pytest.fixture(scope="module")
def reference(smollm2_reference) -> list[Generation]:
    return smollm2_reference[:8]


def test_dflash_echo_lossless(smollm2_dir, dflash_head, prompt_ids, reference):
    got, metrics, _ = SUITE.serve("echo", smollm2_dir, dflash_head, prompt_ids)
    SUITE.check_lossless("echo", got, reference, metrics)


def test_dflash_hybrid_lossless(smollm2_dir, dflash_head, prompt_ids, reference):
    """`hybrid` (what `make serve` runs on a CPU): the DFlash head and each request's n-gram drafter
    in one tree; n-gram nodes drafted, output plain decoding's."""
    got, metrics, _ = SUITE.serve("echo", smollm2_dir, dflash_head, prompt_ids, env={"SGLANG_ECHO_HYBRID": "1"})
    SUITE.check_lossless("echo/hybrid", got, reference, metrics)
    assert metrics.get("echo_hybrid_ngram_nodes_total", 0) > 0


def test_dflash_chain_drafts_what_offline_dflash_drafts(smollm2_dir, dflash_head, prompt_ids, reference):
    got, metrics, alone = SUITE.serve("chain", smollm2_dir, dflash_head, prompt_ids, one_by_one=4)
    SUITE.check_lossless("chain", got, reference, metrics)
    server = [g.meta["spec_num_correct_drafts"] for g in alone]
    offline, deepest = SUITE.offline_correct_drafts(smollm2_dir, dflash_head, prompt_ids[:4], SPEC.num_steps)
    print(f"[dflash/chain] accepted drafts per request: server {server}, offline {offline}; deepest step {deepest}")
    assert server == offline
    assert deepest >= 2  # drafts from the block's later positions were accepted, so they were compared


@pytest.mark.parametrize("policy", ["static-tree"])
def test_dflash_baseline_lossless(policy, smollm2_dir, dflash_head, prompt_ids, reference):
    got, metrics, _ = SUITE.serve(policy, smollm2_dir, dflash_head, prompt_ids)
    SUITE.check_lossless(policy, got, reference, metrics)


@pytest.mark.parametrize("policy", matrix("dflash", ("dense-gating", "fixed-threshold", "budgeted-chain")))
def test_dflash_policy_matrix(policy, smollm2_dir, dflash_head, prompt_ids, reference):
    got, metrics, _ = SUITE.serve(policy, smollm2_dir, dflash_head, prompt_ids)
    SUITE.check_lossless(policy, got, reference, metrics)
