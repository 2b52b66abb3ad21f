"""``EchoSpecAlgo``: ECHO's duck-typed algorithm object, and its server-arg hooks.

Both hooks run inside sglang's ``record_foreign_defaults``: reads see the resolved arguments,
writes to real ``ServerArgs`` fields are recorded as declared resolutions. ``validate_server_args``
runs first, then ``handle_server_args``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from sglang.srt.speculative.spec_registry import CustomSpecAlgo

log = logging.getLogger(__name__)

NAME = "ECHO"
DEFAULT_MAX_RUNNING_REQUESTS = 48  # as sglang's _handle_eagle_family


class EchoSpecAlgo(CustomSpecAlgo):
    """Tree speculation whose trees are chosen by an ECHO core policy.

    With the default ``drafter: eagle3`` it is an EAGLE-3-drafted algorithm (EAGLE plumbing:
    aux hidden capture, draft KV, FutureMap relay of topk/hidden states). With ``drafter:
    ngram`` there is no draft model and it presents itself to sglang exactly as NGRAM does
    (``is_ngram()``: verify-only relay, no draft KV, synchronous grammar), and the worker is
    :class:`~sglang_echo.integration.ngram_worker.EchoNgramWorker`.

    The drafter is settled once, when sglang registers the algorithm in a process (the plugin
    runs in every sglang process, and the ECHO settings are the same in all of them), so the
    algorithm's identity never changes under sglang's feet. An invalid setting falls back to the
    default here; ``validate_server_args`` reports it and stops the launch.
    """

    def __init__(self, name, factory, supports_overlap, validate_server_args):
        super().__init__(
            name=name, factory=factory, supports_overlap=supports_overlap, validate_server_args=validate_server_args
        )
        from .config import Drafter, EchoConfigError, configured_drafter

        try:
            self.drafter = configured_drafter()
        except EchoConfigError:
            self.drafter = Drafter.EAGLE3
        self._ngram = self.drafter == Drafter.NGRAM

    def is_eagle(self) -> bool:  # EAGLE plumbing: aux hidden capture, KV sizing, FutureMap
        return not self._ngram

    def is_eagle3(self) -> bool:  # EAGLE-3 aux hidden states + hot-token map
        return not self._ngram

    def is_ngram(self) -> bool:  # NGRAM plumbing: no draft model/KV, accept_tokens relay
        return self._ngram

    def has_draft_kv(self) -> bool:
        return not self._ngram

    def supports_grammar_overlap(self) -> bool:  # EAGLE: verify goes through run_eagle_verify
        return not self._ngram  # NGRAM drafts on the host and stays synchronous

    def need_topk(self) -> bool:  # FutureMap relays topk_p / topk_index / hidden states
        return not self._ngram

    def carries_draft_hidden_states(self) -> bool:
        return not self._ngram

    def create_future_map(
        self, device, req_to_token_pool, needs_cpu_seq_lens: bool = True, needs_confidence_relay: bool = False
    ):
        from sglang.srt.managers.overlap_utils import FutureMap

        return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

    def get_platform_worker_cls(self):
        return None

    def create_worker(self, server_args):
        if not self._ngram:
            return super().create_worker(server_args)  # the registered factory: EchoWorker
        # Registered with supports_overlap=True, so the base method would only call the factory.
        from .compat import assert_compatible

        assert_compatible("worker")
        from .ngram_worker import EchoNgramWorker

        return EchoNgramWorker

    def supports_ragged_verify(self) -> bool:
        """sglang's compact ragged-verify CUDA graphs for the target (with
        ``SGLANG_RAGGED_VERIFY_MODE=compact``): asked when the target's decode graph runner (and
        its attention backend) is built; see :func:`.ragged.wants_ragged_graphs`."""
        from sglang.srt.arg_groups.model_override_base import attention_backends_of
        from sglang.srt.runtime_context import get_server_args

        from .ragged import wants_ragged_graphs

        try:
            sa = get_server_args()
        except ValueError:  # no server in this process (a tool, a test)
            return False
        return wants_ragged_graphs(_echo_config(sa).verify, self.drafter, sa.device, attention_backends_of(sa)[1])

    def handle_server_args(self, server_args) -> None:
        handle_server_args(server_args)


def _echo_config(sa):
    from .config import load_config

    return load_config(
        num_steps=sa.speculative_num_steps,
        topk=sa.speculative_eagle_topk,
        num_draft_tokens=sa.speculative_num_draft_tokens,
    )


def validate_server_args(sa) -> None:
    """Reject what ECHO does not support, with messages that name the flag."""
    from sglang_echo.core.scheduler import ControlKernel

    from .config import configured_drafter
    from .served_calibration import load_calibration_for

    def no(cond: bool, msg: str) -> None:
        if cond:
            raise ValueError(f"--speculative-algorithm ECHO: {msg}")

    if configured_drafter() == "ngram":
        no(
            bool(sa.speculative_draft_model_path),
            "drafter 'ngram' uses no draft model: drop --speculative-draft-model-path",
        )
    else:
        no(
            not sa.speculative_draft_model_path,
            "needs a draft head (EAGLE-3, or DART / DFlash with that drafter): pass --speculative-draft-model-path "
            "(or set the ECHO drafter to 'ngram', which needs none)",
        )
        from sglang_echo.drafters.base import head_kind
        from sglang_echo.models.drafts import DRAFTER_NAMES

        path, drafter = sa.speculative_draft_model_path, configured_drafter()
        kind = head_kind(path)
        no(
            kind != drafter and kind in ("dart", "dflash"),
            f"{path} is a {DRAFTER_NAMES[kind]} head: set the ECHO drafter to '{kind}' (SGLANG_ECHO_DRAFTER={kind})",
        )
        no(
            kind != drafter and drafter in ("dart", "dflash"),
            f"drafter '{drafter}' needs a {DRAFTER_NAMES[drafter]} head (config.json architectures); {path} is not one "
            f"({DRAFTER_NAMES[kind] + ' head' if kind else 'no config.json'})",
        )
        if drafter == "dflash":
            from sglang_echo.drafters.dflash_head import DFlashConfig

            try:  # the variants sglang loads but the DFlash drafter does not compute (sliding window, ...)
                DFlashConfig.from_hf(json.loads((Path(path) / "config.json").read_text()), num_target_layers=1 << 16)
            except ValueError as e:
                no(True, f"{path}: {e}")
            no((sa.tp_size or 1) > 1, "drafter 'dflash' does not support tensor parallelism (--tp-size > 1) yet")
    no((sa.pp_size or 1) > 1, "pipeline parallelism (--pp-size > 1) is not supported")
    no(bool(sa.enable_dp_attention), "--enable-dp-attention is not supported")
    no(str(sa.disaggregation_mode or "null") != "null", "prefill/decode disaggregation is not supported")
    no(bool(sa.speculative_adaptive), "--speculative-adaptive is not supported (ECHO adapts per step itself)")
    no(
        bool(sa.speculative_use_rejection_sampling),
        "--speculative-use-rejection-sampling is chain-only (topk=1); ECHO verifies trees",
    )
    no(bool(sa.enable_multi_layer_eagle), "--enable-multi-layer-eagle is not supported")
    no((sa.page_size or 1) > 1, "--page-size > 1 is not supported yet (the draft KV lanes assume page size 1)")
    no(
        sa.speculative_eagle_topk is not None and sa.speculative_eagle_topk < 2,
        f"--speculative-eagle-topk={sa.speculative_eagle_topk}: ECHO needs topk >= 2 (W_max, the tree width)",
    )
    cfg = _echo_config(sa)  # raises EchoConfigError with the offending setting
    no(
        cfg.control_kernel == ControlKernel.TRITON and (sa.device or "cuda") != "cuda",
        f"control_kernel 'triton' (SGLANG_ECHO_CONTROL_KERNEL) needs a CUDA device, not --device {sa.device}",
    )
    no(
        cfg.control_kernel == ControlKernel.TRITON and cfg.drafter == "ngram",
        "control_kernel 'triton' (SGLANG_ECHO_CONTROL_KERNEL) fuses device-side trees; the n-gram drafter builds "
        "its trees on the host (use torch or auto)",
    )
    # A missing, malformed or mismatched calibration file is a start-up error, here in the
    # main process, before any subprocess starts.
    load_calibration_for(cfg, model_path=sa.model_path, draft_path=sa.speculative_draft_model_path)


def handle_server_args(sa) -> None:
    cfg = _echo_config(sa)
    if sa.max_running_requests is None:
        sa.max_running_requests = DEFAULT_MAX_RUNNING_REQUESTS
    if sa.device == "cpu" and not sa.disable_overlap_schedule:
        sa.disable_overlap_schedule = True
    if sa.enable_mixed_chunk:
        sa.enable_mixed_chunk = False
    sa.speculative_num_steps = cfg.max_depth
    sa.speculative_eagle_topk = cfg.sglang_topk
    sa.speculative_num_draft_tokens = cfg.resolved_width()
    from sglang_echo.kernels.registration import BACKEND_NAME

    if (
        BACKEND_NAME in (sa.attention_backend, sa.decode_attention_backend)
        and not sa.speculative_draft_attention_backend
    ):
        # sglang's draft backend factory knows no echo_tree_triton (it would fall back to FlashInfer);
        # the draft model's decode and extend are plain attention: sglang's Triton backend runs them.
        sa.speculative_draft_attention_backend = "triton"
    log.info("ECHO: %s", cfg.describe())
