"""Ragged verify on a GPU under CUDA graphs: ``echo_tree_triton`` replaying sglang's token-tier graphs.

Two servers with the same random SmolLM2-shaped target (4 layers, weights from a seed, no tokenizer:
prompts are token ids) and an EAGLE-3 head for it, ``--attention-backend echo_tree_triton``, CUDA
graphs on: ``verify: ragged`` (the launcher sets ``SGLANG_RAGGED_VERIFY_MODE=compact``, so the
target captures one graph per token tier) and ``verify: padded`` (uniform ``W``-wide graphs, the
FULL_MASK verify buffer). One batch of 8 requests submitted at once, K_max = 16 binding:

* the same outputs, verify steps and accepted drafts per request;
* ragged: the target's graph runner replayed a tier graph for every verify step (its own log,
  ``SGLANG_LOG_DECODE_GRAPH_KEY=1``), the tiers sum to ``echo_target_tokens_total``, which lies
  between the verified ``sum K_i`` and padded's ``B x W`` per step.

The draft runs on sglang's ``triton`` backend (``echo_tree_triton`` is a target-verify backend;
sglang's draft factory would fall back to FlashInfer).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import requests
import torch

from ..conftest import INTEGRATION_PORTS, launch_test_server
from .conftest import CACHE, MAX_NEW_TOKENS, SPEC, scrape

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

BATCH, K_MAX, VOCAB = 8, 16, 49152
SMOLLM2_SHAPE = dict(hidden_size=576, num_heads=9, num_kv_heads=3, intermediate_size=1536, num_layers=4)
REPLAY = re.compile(r"Decode graph replay: worker=target key_size=(\d+) \(num_tokens\) mode=TARGET_VERIFY")


@pytest.fixture(scope="module")
def random_pair() -> tuple[Path, Path]:
    from sglang_echo.models.tiny import write_tiny_eagle3_draft, write_tiny_llama

    vocab_dir = CACHE / "vocab-49152"  # write_tiny_llama takes the vocabulary size from a config.json
    vocab_dir.mkdir(parents=True, exist_ok=True)
    (vocab_dir / "config.json").write_text(json.dumps({"vocab_size": VOCAB}))
    target = write_tiny_llama(CACHE / "smollm2-shaped-4l", vocab_dir, **SMOLLM2_SHAPE).path
    draft = write_tiny_eagle3_draft(
        CACHE / "smollm2-shaped-4l-eagle3", target, init="early_exit", aux_layer_ids=[0, 1, 2], draft_vocab_size=VOCAB
    ).path
    return target, draft


def _serve(pair, verify: str, inputs):
    target, draft = pair
    env = {
        "SGLANG_ECHO_POLICY": "echo",
        "SGLANG_ECHO_K_MAX": str(K_MAX),
        "SGLANG_ECHO_VERIFY": verify,
        "SGLANG_LOG_DECODE_GRAPH_KEY": "1",
    }
    srv = launch_test_server(
        INTEGRATION_PORTS,
        f"gpu-ragged-{verify}",
        model_path=target,
        spec="echo",
        draft_path=draft,
        spec_options=SPEC,
        dtype="float32",
        enable_metrics=True,
        context_length=1024,
        skip_tokenizer_init=True,
        attention_backend="echo_tree_triton",
        extra_env=tuple(sorted(env.items())),
        extra_args=(
            "--speculative-num-steps",
            str(SPEC.num_steps),
            "--speculative-eagle-topk",
            str(SPEC.eagle_topk),
            "--speculative-num-draft-tokens",
            str(SPEC.num_draft_tokens),
            "--speculative-draft-attention-backend",
            "triton",
        ),
    )
    try:
        body = {
            "input_ids": inputs,
            "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0.0, "ignore_eos": True},
        }
        r = requests.post(srv.base_url + "/generate", json=body, timeout=600)
        r.raise_for_status()
        return r.json(), scrape(srv.base_url), srv.log_path.read_text(errors="replace")
    finally:
        srv.stop()


def test_ragged_tiers_equal_padded_acceptance(random_pair) -> None:
    g = torch.Generator().manual_seed(0)
    inputs = torch.randint(100, VOCAB, (BATCH, 64), generator=g).tolist()
    r_out, r_m, r_log = _serve(random_pair, "ragged", inputs)
    p_out, p_m, _ = _serve(random_pair, "padded", inputs)
    for i, (r, p) in enumerate(zip(r_out, p_out)):
        assert r["output_ids"] == p["output_ids"], f"request {i}: outputs differ"
        for key in ("spec_verify_ct", "spec_num_correct_drafts"):
            assert r["meta_info"][key] == p["meta_info"][key], f"request {i}: {key} differs"
    tiers = [int(t) for t in REPLAY.findall(r_log)]
    assert "ECHO worker: ragged verify" in r_log and "ECHO worker: padded verify" not in r_log
    assert len(tiers) == r_m["echo_steps_total"], "a ragged verify step ran eagerly (no tier graph)"
    assert sum(tiers) == r_m["echo_target_tokens_total"]
    assert r_m["echo_verified_tokens_total"] <= sum(tiers) < p_m["echo_target_tokens_total"]
    assert r_m["echo_verified_tokens_total"] == p_m["echo_verified_tokens_total"]
    print(
        f"verified {r_m['echo_verified_tokens_total']:.0f} tokens; target tokens: ragged tiers {sum(tiers)} "
        f"({sorted(set(tiers))}) vs padded {p_m['echo_target_tokens_total']:.0f}"
    )
