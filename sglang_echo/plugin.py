"""sglang general plugin: registers ``--speculative-algorithm ECHO`` (and its ragged-verify hook on
``ModelRunner.forward``), the ``echo_tree_triton`` attention backend (Triton tree verify, GPU) and
the request guard (``integration/request_guard.py``: malformed requests get a 400, every server);
with ``SGLANG_ECHO_SIMULATE`` set, also simulated acceptance's hooks (``integration/simulate.py``).

Entry point ``sglang.srt.plugins: echo = "sglang_echo.plugin:register"``. sglang calls it (via
``load_plugins()``) in the main process before parsing args and again in every spawned
scheduler/detokenizer process. Registration is unconditional (CPU and GPU), idempotent, and
cheap: the worker (which imports sglang's EAGLE worker) is imported by the factory only when
the scheduler builds it.

sglang logs, rather than raises, exceptions from plugins; so an incompatible sglang is reported
by ``register()`` raising :class:`~sglang_echo.integration.compat.EchoCompatError` (logged by
sglang, after which ``ECHO`` is an unknown algorithm), and again in the factory.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

NAME = "ECHO"


def _worker_factory(server_args):
    from sglang_echo.integration.compat import assert_compatible

    assert_compatible("worker")
    from sglang_echo.integration.worker import EchoWorker

    return EchoWorker


def is_registered() -> bool:
    from sglang.srt.speculative.spec_registry import get_spec

    return get_spec(NAME) is not None


def register() -> None:
    """Register ECHO with sglang's speculative-algorithm registry (idempotent)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec

    from sglang_echo.kernels.registration import register_sglang_backend

    register_sglang_backend()  # `--attention-backend echo_tree_triton` (GPU target verify)
    if get_spec(NAME) is not None:
        return
    from sglang_echo.integration.compat import assert_compatible

    assert_compatible("register")
    from sglang_echo.integration.spec import EchoSpecAlgo, validate_server_args

    SpeculativeAlgorithm.register(
        NAME,
        supports_overlap=True,
        validate_server_args=validate_server_args,
        spec_class=EchoSpecAlgo,
    )(_worker_factory)

    # Ragged verify: the target forward of a verify input the ECHO worker marked runs on its real
    # tree nodes only (integration/ragged.py); every other forward passes straight through.
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_echo.integration.ragged import RUNNER_FORWARD, ragged_verify_forward

    HookRegistry.register(RUNNER_FORWARD, ragged_verify_forward, HookType.AROUND)
    # drafter dflash: the target captures the DFlash head's layers through EAGLE-3's aux plumbing.
    from sglang_echo.integration.dflash import RESOLVER, resolve_capture_layers

    HookRegistry.register(RESOLVER, resolve_capture_layers, HookType.AROUND)
    # Every server (any --speculative-algorithm, CPU or GPU): a request the model cannot run (token
    # ids outside its vocabulary, an empty prompt, ...) gets a 400 before it reaches the scheduler.
    from sglang_echo.integration import request_guard

    request_guard.register(HookRegistry, HookType)
    # SGLANG_ECHO_SIMULATE only (integration/simulate.py): the target's tokens come from a recorded trace.
    from sglang_echo.integration import simulate

    simulate.register(HookRegistry, HookType.AROUND)
    log.debug("ECHO speculative algorithm registered")
