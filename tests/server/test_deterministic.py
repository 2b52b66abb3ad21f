"""bf16 you can trust: with ``--enable-deterministic-inference`` (the launcher's ``--deterministic``)
a bf16 server's greedy tokens do not depend on the batch, and ECHO's equal plain decoding's.

Without the mode these checks fail: on these 12 prompts bf16 plain decoding one at a time and
eight at a time agreed on 10 (on 24 prompts of an earlier run: 6), and ECHO (EAGLE-3) at eight
matched plain decoding on 8, so a speculative server's exactness could not be told from noise.
Three servers (SmolLM2, bf16, 12 prompts, 32 new tokens): plain decoding at concurrency 1 and 8,
then ECHO with the shipped EAGLE-3 head and with the n-gram drafter (tree verify, ragged, fixed
K_max) at concurrency 8, drafts accepted. The mode's ops are tested bit for bit in
``tests/platform/test_invariant_attention.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_echo.models import prompts
from sglang_echo.models.drafts import stage_head
from sglang_echo.serve.client import Generation, generate_many
from sglang_echo.serve.server import SGLangServer

from ..conftest import SERVER_PORTS, launch_test_server

needs_bf16 = pytest.mark.skipif(
    not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="this CPU has no oneDNN bf16 GEMMs (the platform serves float32 there)",
)

PER_SET = 3  # x 4 sets (chat, math, summarize, humaneval) = 12 prompts
MAX_NEW_TOKENS = 32
GEN_TIMEOUT = 900.0
# ECHO's shape, as tests/integration: depth 4, top-k 2 (real trees), 7 verify slots per request.
ECHO_ARGS = ("--speculative-num-steps", "4", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "7")


def _start(model: Path, tag: str, **options) -> SGLangServer:
    return launch_test_server(
        SERVER_PORTS,
        f"deterministic-{tag}",
        model_path=model,
        dtype="bfloat16",
        deterministic=True,
        max_total_tokens=8192,
        context_length=1024,
        **options,
    )


def _generate(srv: SGLangServer, inputs: list[list[int]], workers: int) -> list[Generation]:
    return generate_many(srv.base_url, inputs, workers=workers, max_new_tokens=MAX_NEW_TOKENS, timeout=GEN_TIMEOUT)


def _differing(want: list[Generation], got: list[Generation]) -> list[int]:
    return [i for i, (a, b) in enumerate(zip(want, got)) if a.output_ids != b.output_ids]


@pytest.fixture(scope="module")
def prompt_ids(smollm2_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    return [tok(p.as_text(tok), add_special_tokens=False).input_ids for p in prompts.load_mixed(PER_SET)]


@pytest.fixture(scope="module")
def plain(smollm2_dir: Path, prompt_ids) -> dict[int, list[Generation]]:
    """Plain bf16 decoding in the mode, one request at a time and 8 at a time (one server)."""
    srv = _start(smollm2_dir, "none")
    try:
        return {c: _generate(srv, prompt_ids, c) for c in (1, 8)}
    finally:
        srv.stop()


def test_the_launcher_asks_sglang_for_the_mode() -> None:
    """``DETERMINISTIC=1 make serve`` runs the launcher with ``--deterministic``."""

    def exec_line(*extra: str) -> str:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "sglang_echo.serve.launch",
                "--spec",
                "none",
                "--port",
                "32098",
                "--device",
                "cpu",
                "--dtype",
                "bfloat16",
                "--dry-run",
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        return next(line for line in r.stdout.splitlines() if "exec:" in line)

    assert exec_line("--deterministic").endswith("--enable-deterministic-inference")
    assert "--enable-deterministic-inference" not in exec_line()


@pytest.mark.server
@needs_bf16
def test_plain_decoding_does_not_depend_on_the_batch(plain) -> None:
    assert all(len(g.output_ids) > 0 for g in plain[1])
    bad = _differing(plain[1], plain[8])
    assert not bad, f"bf16 plain decoding, concurrency 1 vs 8: prompts {bad} of {len(plain[1])} differ"


@pytest.mark.server
@needs_bf16
@pytest.mark.parametrize("drafter", ["eagle3", "ngram"])
def test_echo_equals_plain_decoding_in_bf16(drafter: str, plain, prompt_ids, smollm2_dir: Path) -> None:
    draft = stage_head(smollm2_dir) if drafter == "eagle3" else None
    env = (("SGLANG_ECHO_DRAFTER", drafter),)
    srv = _start(smollm2_dir, f"echo-{drafter}", spec="echo", draft_path=draft, extra_env=env, extra_args=ECHO_ARGS)
    try:
        got = _generate(srv, prompt_ids, 8)
    finally:
        srv.stop()
    bad = _differing(plain[1], got)
    assert not bad, f"ECHO ({drafter}) vs plain decoding, bf16: prompts {bad} of {len(got)} differ"
    verify = sum(g.meta.get("spec_verify_ct", 0) for g in got)
    accepted = sum(g.meta.get("spec_num_correct_drafts", 0) for g in got)
    print(f"\n[echo-{drafter} bf16] {verify} verify steps, {accepted} accepted draft tokens")
    assert accepted > 0, "no draft was ever accepted: ECHO's exactness went untested"
