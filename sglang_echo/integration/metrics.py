"""ECHO's own Prometheus metrics (created lazily, only with ``--enable-metrics``).

They live in the scheduler process; sglang serves a ``prometheus_client`` multiprocess registry
on ``/metrics``, so anything created here after ``PROMETHEUS_MULTIPROC_DIR`` is set is exported.
sglang's own ``spec_cap_length`` / ``spec_cap_lens_histogram`` come from ``cap_lens = K_i``.

* ``echo_verified_tokens_total``: sum of K_i (roots included) over all steps;
* ``echo_target_tokens_total``: tokens the target's verify forwards computed (sum of K_i with
  ragged verify, batch size x W padded);
* ``echo_accepted_tokens_total``: accepted tokens incl. the bonus token;
* ``echo_steps_total``: verify steps;
* ``echo_gate_evaluated_total{depth}`` / ``echo_gate_passed_total{depth}``;
* ``echo_budget_k_max``: the configured K_max;
* ``echo_step_verified_tokens_max``: the largest per-step sum of K_i seen;
* ``echo_budget_exceeded_total``: steps over ``max(K_max, bs)`` (must stay 0).
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class EchoMetrics:
    def __init__(self, cfg, enabled: bool) -> None:
        self.cfg = cfg
        self.enabled = enabled
        self.step_max = 0
        self.totals = {"verified": 0, "target": 0, "accepted": 0, "steps": 0, "exceeded": 0}
        self._m = None
        if enabled:
            try:
                self._create()
            except Exception as e:  # metrics must never take the server down
                log.warning("ECHO: could not create Prometheus metrics (%s: %s)", type(e).__name__, e)
                self._m = None

    def _create(self) -> None:
        from prometheus_client import Counter, Gauge

        self._m = {
            "verified": Counter("echo_verified_tokens", "Tokens submitted to verification (sum of K_i, roots included)"),
            "target": Counter("echo_target_tokens", "Tokens computed by the target's verify forwards (padding included)"),
            "accepted": Counter("echo_accepted_tokens", "Tokens accepted by verification (incl. bonus)"),
            "steps": Counter("echo_steps", "ECHO verify steps"),
            "exceeded": Counter("echo_budget_exceeded", "Steps whose sum of K_i exceeded max(K_max, bs)"),
            "gate_eval": Counter("echo_gate_evaluated", "Confidence gates evaluated", ["depth"]),
            "gate_pass": Counter("echo_gate_passed", "Confidence gates passed", ["depth"]),
            "k_max": Gauge("echo_budget_k_max", "Configured K_max", multiprocess_mode="max"),
            "step_max": Gauge("echo_step_verified_tokens_max", "Largest per-step sum of K_i", multiprocess_mode="max"),
        }
        self._m["k_max"].set(self.cfg.k_max)

    def on_step(self, st, target_tokens: int) -> None:
        total = int(st.sizes.sum())
        self.totals["verified"] += total
        self.totals["target"] += target_tokens
        self.totals["steps"] += 1
        self.step_max = max(self.step_max, total)
        if self._m is None:
            return
        self._m["verified"].inc(total)
        self._m["target"].inc(target_tokens)
        self._m["steps"].inc()
        self._m["step_max"].set(self.step_max)
        if st.gate_evaluated is not None:
            ev, pa = st.gate_evaluated.tolist(), st.gate_passed.tolist()
            for d, (e, p) in enumerate(zip(ev, pa)):
                if e:
                    self._m["gate_eval"].labels(depth=str(d)).inc(e)
                    self._m["gate_pass"].labels(depth=str(d)).inc(p)

    def on_accept(self, num_correct_drafts_per_req) -> None:
        n = sum(int(x) for x in num_correct_drafts_per_req) + len(num_correct_drafts_per_req)
        self.totals["accepted"] += n
        if self._m is not None:
            self._m["accepted"].inc(n)

    def budget_exceeded(self) -> None:
        self.totals["exceeded"] += 1
        if self._m is not None:
            self._m["exceeded"].inc()

    def check_budget(self, policy, k_max: int, sizes) -> None:
        """Count (and log) a step of a budgeted policy that verified over max(K_max, bs) (Eq. 4)."""
        if not getattr(policy, "budgeted", False):
            return
        total, bs = int(sizes.sum()), sizes.numel()
        if total > max(k_max, bs):
            self.budget_exceeded()
            log.error("ECHO: step verified %d tokens for %d requests, over the budget max(K_max=%d, bs)", total, bs, k_max)
