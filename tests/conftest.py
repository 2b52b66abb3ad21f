"""Shared fixtures (keep small). Server fixtures live in tests/server/conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The prepared SmolLM2-135M-Instruct checkpoint (bf16), built once and cached on disk."""
    from sglang_echo.models.prepare import prepare

    return prepare().path
