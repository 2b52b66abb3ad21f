"""Fixtures for the offline loop tests: a tiny random Llama (SmolLM2 tokenizer) on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, smollm2_dir: Path) -> Path:
    from sglang_echo.models.tiny import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("eval") / "tiny-llama", smollm2_dir).path
