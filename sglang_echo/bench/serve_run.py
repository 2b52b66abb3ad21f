"""`echo-bench serve`'s results: one :class:`Run` per config, level and pass, the :class:`Report`
that holds them, and each request's figures from sglang's ``meta_info`` (:func:`request_record`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .latency import quartiles

CONTROL_GOAL = 0.03  # ECHO's control plane: at most 3% of the step, at every batch size


@dataclass
class Run:
    config: str
    concurrency: int
    requests: int
    seconds: float
    completion_tokens: int
    verify_steps: int
    lossless: bool | None = None
    startup_seconds: float | None = None
    nominal_depth: int | None = None  # static trees' depth (EAGLE-3 num_steps); None: per request
    per_request: list[dict] = field(default_factory=list)  # request_record() of every request
    echo: dict | None = None  # echo_deltas() of the level (ECHO servers with metrics)
    repeat: int = 0  # which pass over the configs (--repeats): speedups compare runs of one pass
    server_cpu_s: float | None = None  # CPU seconds the server's processes used during the level
    step_times: dict | None = None  # step_times.delta() of the level (CPU-platform servers)
    nominal_tokens: int | None = None  # static trees' verified tokens per request and step (num_draft_tokens)
    request_rate: float | None = None  # open-loop levels: Poisson arrivals per second (concurrency: the cap)
    latency: dict | None = None  # latency.latency_summary() of the level

    @property
    def level(self) -> float:
        """What the level is known by: its request rate (open loop), else its concurrency."""
        return self.concurrency if self.request_rate is None else self.request_rate

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds

    @property
    def cpu_ms_per_token(self) -> float | None:
        """Server CPU milliseconds per generated token: the work a token costs, which other load
        on a shared host does not change the way it changes wall-clock rates."""
        if self.server_cpu_s is None or not self.completion_tokens:
            return None
        return 1000 * self.server_cpu_s / self.completion_tokens

    @property
    def mat(self) -> float | None:
        """Tokens committed per verify step per request (sglang's accept length incl. bonus)."""
        return self.completion_tokens / self.verify_steps if self.verify_steps else None

    @property
    def draft_yield(self) -> float | None:
        """ECHO Eq. 3's yield, the share of drafted tokens the target accepted. ECHO servers count
        verified and accepted tokens, less one root and one bonus token per request and step (a
        request's verify steps); a static tree drafts ``num_draft_tokens - 1`` per request and
        step, and every token but a request's first (its prefill's) and each step's bonus was an
        accepted draft. None without drafts."""
        e = self.echo or {}
        if e.get("verified_tokens") is not None and e.get("accepted_tokens") is not None:
            drafted, accepted = e["verified_tokens"] - self.verify_steps, e["accepted_tokens"] - self.verify_steps
        elif self.nominal_tokens and self.verify_steps:
            drafted = self.verify_steps * (self.nominal_tokens - 1)
            accepted = self.completion_tokens - self.requests - self.verify_steps
        else:
            return None
        return accepted / drafted if drafted > 0 else None

    @property
    def utilisation(self) -> dict | None:
        """Quartiles of the per-request u (None without any)."""
        return quartiles([r["u"] for r in self.per_request if r.get("u") is not None])

    def derived(self) -> dict:
        u = self.utilisation or {}
        e = self.echo or {}
        summary = self.latency or {}
        lat = {
            f"{what}_{p}": (summary.get(what) or {}).get(p)
            for what in ("e2e", "ttft", "itl")
            for p in ("p50", "p90", "p99")
        }
        return {
            "config": self.config,
            "concurrency": self.concurrency,
            "request_rate": self.request_rate,
            "tokens_per_s": self.tokens_per_s,
            "requests_per_s": self.requests_per_s,
            **lat,
            "mat": self.mat,
            "yield": self.draft_yield,
            "u_median": u.get("median"),
            "u_q1": u.get("q1"),
            "u_q3": u.get("q3"),
            "verified_per_step": e.get("verified_per_step"),
            "k_max": e.get("k_max"),
            "control_share": e.get("control_share"),
            "cpu_ms_per_token": self.cpu_ms_per_token,
        }


@dataclass
class Report:
    machine: dict
    settings: dict
    runs: list[Run] = field(default_factory=list)


def report_from_json(data: dict) -> Report:
    """A :class:`Report` back from ``serve.json`` (older files lack the newer fields: defaults)."""
    names = set(Run.__dataclass_fields__)
    runs = [Run(**{k: v for k, v in r.items() if k in names}) for r in data.get("runs", [])]
    for r in runs:  # JSON has no infinity: an "inf" rate is written as a string
        if isinstance(r.request_rate, str):
            r.request_rate = float(r.request_rate)
    return Report(data.get("machine", {}), data.get("settings", {}), runs)


# -- per request: MAT, depth, utilisation -------------------------------------------------------
def request_record(
    meta: dict,
    output_ids: list[int] | None,
    nominal_depth: int | None = None,
    dataset: str | None = None,
    seconds: float | None = None,
) -> dict:
    """One request's figures from sglang's ``meta_info``.

    MAT = completion_tokens / spec_verify_ct (sglang's ``spec_accept_length``: bonus token
    included). Depth = ``sum(meta_info["echo_tree_depth"]) / spec_verify_ct`` where the ECHO
    worker reports it (the mean depth of the request's trees, 0 for a root-only step), else
    ``nominal_depth``. u = MAT / depth over the steps that drafted for the request (None without
    any): a root-only step commits one token and has no draft to use, so ECHO's u counts the
    tokens its drafting steps committed over their summed depth, ``(tokens - 1 - root-only
    steps) / depth_sum`` (the first token is the prefill's). As MAT counts the bonus token, u can
    exceed 1 for shallow trees. ``u_drafts`` = accepted draft tokens / drafted depth
    (``spec_num_correct_drafts / depth_sum``) leaves it out.
    """
    tokens = int(meta.get("completion_tokens", len(output_ids or [])))
    steps = int(meta.get("spec_verify_ct", 0) or 0)
    mat = tokens / steps if steps else None
    depths = meta.get("echo_tree_depth")
    depth_sum = None
    if isinstance(depths, list):
        depth_sum = sum(int(d) for d in depths if d is not None)
        depth = depth_sum / steps if steps else None
        # one entry per output token, a step's depth on the first token it commits: nonzero once per drafting step
        root_only_steps = steps - sum(1 for d in depths if d)
        u = (tokens - 1 - root_only_steps) / depth_sum if steps and depth_sum else None
    else:
        depth = float(nominal_depth) if nominal_depth else None
        u = mat / depth if mat is not None and depth else None
    correct = meta.get("spec_num_correct_drafts")
    u_drafts = correct / (depth * steps) if correct is not None and depth and steps else None
    rec = {
        "tokens": tokens,
        "verify_ct": steps,
        "mat": mat,
        "depth": depth,
        "u": u,
        "u_drafts": u_drafts,
        "k_mean": meta.get("spec_cap_length"),
    }
    if depth_sum is not None:
        rec["depth_sum"] = depth_sum
    if dataset is not None:
        rec["dataset"] = dataset
    if seconds is not None:
        rec["seconds"] = seconds
    return rec
