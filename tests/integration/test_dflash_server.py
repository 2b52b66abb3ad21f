"""ECHO with the DFlash drafter (``drafter: dflash``) in real sglang servers on the CPU platform.

SmolLM2-135M (float32) with the shipped DFlash head:

* echo, chain and static-tree (and the matrix policies, see :func:`.conftest.matrix`) are lossless:
  greedy outputs equal a no-speculation server's token for token, 8 staggered concurrent requests,
  ``K_max`` binding, and drafts get accepted;
* the server drafts what the offline DFlash drafter drafts: one request at a time under the chain
  policy, each request's accepted drafts equal :func:`sglang_echo.eval.loop.speculative_generate`
  with :class:`~sglang_echo.drafters.dflash.DFlashDrafter` (HF target), so the context the draft
  extends write into sglang's draft KV pool is DFlash's (a wrong context stays lossless but accepts
  different drafts);
* the server refuses a DFlash head under another drafter and a non-DFlash head under ``dflash``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_echo.serve.client import Generation

from ._server_args_probe import probe
from .conftest import SPEC, matrix
from .drafter_servers import DrafterSuite

DFLASH = {"SGLANG_ECHO_DRAFTER": "dflash"}


def _offline_dflash(model, head: Path):
    from sglang_echo.drafters.dflash import load_dflash_drafter

    return load_dflash_drafter(head, model.get_input_embeddings().weight, num_target_layers=model.config.num_hidden_layers)


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


def test_server_args_refuse_a_mismatched_head(smollm2_dir, dflash_head, tmp_path):
    """sglang's parser + ECHO's validation in a fresh process with the CPU engine."""
    from sglang_echo.models.drafts import stage_head

    base = ["--model-path", str(smollm2_dir), "--device", "cpu", "--attention-backend", "echo_torch",
            "--speculative-algorithm", "ECHO", "--speculative-draft-model-path"]
    cases = {
        "dflash_head_as_eagle3": {"argv": base + [str(dflash_head)]},
        "eagle3_head_as_dflash": {"argv": base + [str(stage_head(smollm2_dir))], "env": DFLASH},
        "dflash": {"argv": base + [str(dflash_head)], "env": DFLASH},
    }
    r = probe(cases, tmp_path)
    assert "is a DFlash head: set the ECHO drafter to 'dflash'" in r["dflash_head_as_eagle3"]["error"]
    assert "drafter 'dflash' needs a DFlash head" in r["eagle3_head_as_dflash"]["error"]
    assert r["dflash"]["speculative_algorithm"] == "ECHO", r["dflash"]
