"""Fixtures: a tiny random Llama (SmolLM2 tokenizer), its greedy outputs, and small traces."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sglang_echo.core.factory import PolicyConfig
from sglang_echo.replay.record import assemble, record
from sglang_echo.replay.trace import TraceMeta

from .drafters import HashDrafter

MAX_NEW = 16
DEPTH, WIDTH, BEAMS = 6, 4, (1, 2, 3)
# Small shapes keep CPU time low; every policy's depth/k fits inside the recorded DEPTH/WIDTH.
CFG = PolicyConfig(k_max=20, max_depth=5, w_def=1, w_max=3, topk=3, total_tokens=10)
PROMPT_LENS = (5, 11, 8, 3, 7, 9)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, smollm2_dir: Path) -> Path:
    from sglang_echo.models.tiny import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("replay") / "tiny-llama", smollm2_dir).path


@pytest.fixture(scope="session")
def target(tiny_llama_dir):
    from sglang_echo.eval import HFTarget

    return HFTarget.from_pretrained(tiny_llama_dir)


@pytest.fixture(scope="session")
def prompts(target) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, target.config.vocab_size, (n,), generator=g) for n in PROMPT_LENS]


@pytest.fixture(scope="session")
def refs(target, prompts) -> dict:
    """Greedy outputs long enough for every recorded position (the hash drafter's oracle)."""
    from sglang_echo.eval import autoregressive_generate

    out = autoregressive_generate(target, prompts, MAX_NEW + DEPTH)
    return {tuple(p.tolist()): o for p, o in zip(prompts, out.tokens)}


def make_trace(
    target,
    drafter,
    prompts,
    *,
    depth=DEPTH,
    width=WIDTH,
    beams=BEAMS,
    max_nodes=512,
    kind="hash",
    max_new=MAX_NEW,
    batch=4,
):
    trees, outs, _ = record(
        target,
        drafter,
        prompts,
        max_new=max_new,
        depth=depth,
        width=width,
        beams=beams,
        max_nodes=max_nodes,
        batch=batch,
    )
    meta = TraceMeta(
        drafter=kind,
        target="tiny",
        max_new=max_new,
        depth=depth,
        width=width,
        beams=list(beams),
        max_nodes=max_nodes,
        prompts=[f"p{i}" for i in range(len(prompts))],
    )
    return assemble(meta, prompts, trees, outs)


@pytest.fixture(scope="session")
def hash_drafter(target, refs):
    return HashDrafter(refs, target.config.vocab_size)


@pytest.fixture(scope="session")
def hash_trace(target, hash_drafter, prompts):
    return make_trace(target, hash_drafter, prompts)
