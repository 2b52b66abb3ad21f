"""Speculative decoding must be lossless: greedy outputs of NGRAM and EAGLE-3 (tiny EAGLE-3 heads
in SpecForge format, made in the test) equal the no-speculation outputs token for token, with
requests sent concurrently."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sglang_echo.models import prompts
from sglang_echo.models.drafts import stage_head
from sglang_echo.models.tiny import write_tiny_eagle3_draft
from sglang_echo.serve.client import Generation, generate_many
from sglang_echo.serve.flags import SpecOptions

from .conftest import LazyServer, start_server

pytestmark = pytest.mark.server

MAX_NEW_TOKENS = 32
GEN_TIMEOUT = 600.0
WORKERS = 8  # concurrent requests in flight -> batched decode/verify on the server
PER_SET = 5  # x 4 sets (chat, math, summarize, humaneval) = 20 prompts


@pytest.fixture(scope="module")
def prompt_ids(smollm2_dir: Path) -> list[list[int]]:
    """20 varied prompts, tokenised locally with the model's chat template (chat sets) or as
    raw text (HumanEval), so every server sees identical input ids."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    out = []
    for p in prompts.load_mixed(PER_SET):
        text = p.as_text(tok)
        out.append(tok(text, add_special_tokens=False).input_ids)
    assert len(out) >= 20
    return out


@pytest.fixture(scope="module")
def reference(baseline: LazyServer, prompt_ids: list[list[int]]) -> list[Generation]:
    outs = generate_many(
        baseline.get().base_url, prompt_ids, workers=WORKERS, max_new_tokens=MAX_NEW_TOKENS, timeout=GEN_TIMEOUT
    )
    baseline.release()  # free the CPU for the speculative servers that follow
    return outs


def _draft(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path, kw) -> Path:
    if kw == "shipped":
        return stage_head(smollm2_dir)
    return write_tiny_eagle3_draft(tmp_path_factory.mktemp("draft") / "eagle3", smollm2_dir, **kw).path


CASES = {
    # name: (spec, SpecOptions, draft kwargs or None)
    # 4 draft tokens: NGRAM verify is slow on the CPU platform (see README), keep it small.
    "ngram": ("ngram", SpecOptions(num_draft_tokens=4), None),
    # Random head: drafts are (almost) always rejected -> exercises the reject/bonus path.
    "eagle3-chain-random": ("eagle3", SpecOptions(3, 1, 4), dict(init="random")),
    # The shipped, trained head in sglang's own EAGLE3 worker, top-k 2 tree: most steps accept
    # several drafts -> exercises accept + tree verify, and checks sglang reads the head right.
    "eagle3-tree-shipped": ("eagle3", SpecOptions(4, 2, 8), "shipped"),
}
# Committed tokens per verify step the shipped head must reach in sglang (offline MAT: model card).
MIN_TOKENS_PER_STEP_SHIPPED = 1.2  # offline 8-token chains reach ~1.4 (model card); untrained heads ~1.0-1.1


# The random-head chain only exercises rejection, which the tree case also does; it costs another
# server (~2.5 min on the 2-core box), so it runs with SGLANG_ECHO_TEST_EXTENDED=1.
EXTENDED = os.environ.get("SGLANG_ECHO_TEST_EXTENDED") == "1"
PARAMS = [
    pytest.param(
        name,
        marks=pytest.mark.skipif(
            name == "eagle3-chain-random" and not EXTENDED, reason="extended case: set SGLANG_ECHO_TEST_EXTENDED=1"
        ),
    )
    for name in CASES
]


@pytest.mark.parametrize("case", PARAMS)
def test_greedy_is_lossless(
    case: str,
    reference: list[Generation],
    prompt_ids: list[list[int]],
    smollm2_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    spec, spec_opts, draft_kw = CASES[case]
    draft = _draft(tmp_path_factory, smollm2_dir, draft_kw) if draft_kw is not None else None
    srv = start_server(smollm2_dir, spec=spec, draft_path=draft, spec_options=spec_opts)
    try:
        t0 = time.monotonic()
        got = generate_many(
            srv.base_url, prompt_ids, workers=WORKERS, max_new_tokens=MAX_NEW_TOKENS, timeout=GEN_TIMEOUT
        )
        gen_s = time.monotonic() - t0
    finally:
        srv.stop()
    mismatches = [
        (i, ref.output_ids, g.output_ids)
        for i, (ref, g) in enumerate(zip(reference, got))
        if ref.output_ids != g.output_ids
    ]
    assert not mismatches, f"{case}: {len(mismatches)}/{len(got)} differ, first: {mismatches[0]}"
    assert all(len(g.output_ids) > 0 for g in got)
    verify = sum(g.meta.get("spec_verify_ct", 0) for g in got)
    accepted = sum(g.meta.get("spec_num_correct_drafts", 0) for g in got)
    tokens = sum(len(g.output_ids) for g in got)
    print(
        f"\n[{case}] {len(got)} prompts, {tokens} tokens, {verify} verify steps, "
        f"{accepted} accepted draft tokens, generation {gen_s:.1f}s"
    )
    assert verify > 0, "speculation did not run (no verify steps reported)"
    if draft_kw is None or draft_kw == "shipped":
        assert accepted > 0, "no draft was ever accepted: the accept path went untested"
    if draft_kw == "shipped":
        per_step = (tokens - len(got)) / verify  # each request's first token comes from prefill
        assert per_step >= MIN_TOKENS_PER_STEP_SHIPPED, f"shipped head: {per_step:.2f} tokens/step"
