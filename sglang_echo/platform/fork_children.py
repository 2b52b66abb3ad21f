"""A CPU engine forks sglang's scheduler and detokenizer instead of spawning them.

sglang sets the ``spawn`` start method (``engine._set_envs_and_config``) because a CUDA context
cannot cross a fork. A CPU engine has no CUDA context, and a spawned child imports sglang and
torch again: on this project's 2-core CI host that was 15 of the 43 s a SmolLM2 server took to
become healthy (28 s forked; the same tokens/s and outputs). The launcher forks before it starts
any thread of its own (the tokenizer manager and the HTTP server come after the children), and
sglang's ``load_plugins`` is idempotent, so a forked child keeps the hooks its parent applied.

``SGLANG_ECHO_SPAWN=1`` keeps sglang's spawn.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any, Callable

ENV = "SGLANG_ECHO_SPAWN"
SET_ENVS = "sglang.srt.entrypoints.engine._set_envs_and_config"


def _fork_after_set_envs(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND ``_set_envs_and_config``: sglang's settings, then the fork start method."""
    result = original(*args, **kwargs)
    multiprocessing.set_start_method("fork", force=True)
    return result


def register(hooks: Any, around: Any) -> None:
    """Fork sglang's children unless ``SGLANG_ECHO_SPAWN`` is set (``hooks``: sglang's HookRegistry)."""
    if os.environ.get(ENV, "0") in ("", "0"):
        hooks.register(SET_ENVS, _fork_after_set_envs, around)
