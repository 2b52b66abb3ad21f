"""What the SmolLM2 server suites of the drafters with a head (DART, DFlash) share: serving a policy,
the losslessness checks, and the offline drafter's accepted drafts, request by request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from sglang_echo.serve.client import Generation, generate

from .conftest import SPEC, WORKERS, run_staggered, scrape, start

K_MAX = 12  # < 8 requests x 7 slots: the budget binds whenever >= 2 requests are running
BUDGETED = ("echo", "budgeted-chain", "dense-gating", "fixed-threshold")
ALONE_TOKENS = 32


@dataclass(frozen=True)
class DrafterSuite:
    drafter: str  # SGLANG_ECHO_DRAFTER
    # (HF target model, head dir) -> the offline drafter (sglang_echo.drafters), for the same head
    offline: Callable[[torch.nn.Module, Path], object]

    def serve(
        self, policy: str, model: Path, head: Path, prompt_ids, *, env: dict | None = None, one_by_one: int = 0
    ) -> tuple[list[Generation], dict, list[Generation]]:
        """Staggered greedy generations, the metrics, and ``one_by_one`` prompts served alone."""
        env = {
            "SGLANG_ECHO_DRAFTER": self.drafter,
            "SGLANG_ECHO_POLICY": policy,
            "SGLANG_ECHO_K_MAX": str(K_MAX),
            **(env or {}),
        }
        srv = start(model, spec="echo", draft=head, env=env, tag=f"{self.drafter}-{policy}")
        try:
            got = run_staggered(srv.base_url, prompt_ids)
            metrics = scrape(srv.base_url)
            alone = [
                generate(srv.base_url, input_ids=ids, max_new_tokens=ALONE_TOKENS) for ids in prompt_ids[:one_by_one]
            ]
            alive = srv.alive()
        finally:
            srv.stop()
        assert alive
        return got, metrics, alone

    def check_lossless(self, policy: str, got: list[Generation], want: list[Generation], metrics: dict) -> None:
        """Outputs equal no speculation's, the budget held, and drafts were accepted."""
        tag = f"{self.drafter}/{policy}"
        mismatches = [
            (i, w.output_ids, g.output_ids) for i, (w, g) in enumerate(zip(want, got)) if w.output_ids != g.output_ids
        ]
        assert not mismatches, f"{tag}: {len(mismatches)}/{len(got)} outputs differ, first: {mismatches[0]}"
        assert metrics["echo_budget_exceeded_total"] == 0 and metrics["echo_steps_total"] > 0
        if policy.split("/")[0] in BUDGETED:
            assert metrics["echo_step_verified_tokens_max"] <= max(K_MAX, WORKERS)
        for g in got:
            hist = g.meta.get("spec_cap_lens_histogram") or []
            assert sum(hist) == g.meta["spec_verify_ct"] > 0 and len(hist) <= SPEC.num_draft_tokens + 1
        correct = sum(g.meta["spec_num_correct_drafts"] for g in got)
        tokens = sum(g.meta["completion_tokens"] for g in got)
        steps = sum(g.meta["spec_verify_ct"] for g in got)
        print(
            f"[{tag}] tokens={tokens} verify_steps={steps} accepted_drafts={correct} "
            f"accept_len={tokens / max(steps, 1):.2f}"
        )
        assert correct > 0 and steps < tokens

    def offline_correct_drafts(
        self, model_dir: Path, head: Path, prompts: list[list[int]], depth: int
    ) -> tuple[list[int], int]:
        """Accepted drafts per request of the offline loop, one request at a time, chain of ``depth``,
        and the most drafts any step accepted."""
        from transformers import AutoModelForCausalLM

        from sglang_echo.core.baselines import Chain
        from sglang_echo.eval.loop import speculative_generate
        from sglang_echo.eval.target import HFTarget

        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="sdpa")
        drafter = self.offline(model, head)
        target = HFTarget(model, drafter.captured_layers)
        out, deepest = [], 0
        for ids in prompts:
            res = speculative_generate(target, drafter, Chain(depth), [torch.tensor(ids)], max_new_tokens=ALONE_TOKENS)
            out.append(sum(max(int(a[0]), 0) for a in res.accept_len))
            deepest = max([deepest] + [int(a[0]) for a in res.accept_len])
        return out, deepest
