"""Replay == the real sglang server: the same policy, drafter and target, request by request.

For every policy, :func:`validate_server` starts an ECHO server (``--speculative-algorithm ECHO``,
float32, the trace's target, drafter and head; the policy's settings as ``SGLANG_ECHO_*``), sends
each trace prompt alone (greedy, its token ids, the trace's ``max_new``) and compares what sglang
reports for the request with :func:`replay_offline` of that prompt as a batch of one:

* verify steps (``spec_verify_ct``);
* accepted drafts per step, as sglang's histogram (``spec_correct_drafts_histogram``);
* tree sizes ``K_i`` per step (``spec_cap_lens_histogram``; ECHO reports ``cap_lens = K_i``);
* the output tokens against the recorded greedy continuation.

sglang reports histograms, not per-step sequences, so this is exact on every per-step count and
its distribution, not on their order (``echo-replay validate`` compares the order against the
offline engine). One request at a time keeps the batch the replay's: a server batch forms by
timing, which no replay can know.

``simulate`` runs the server in simulated-acceptance mode on the trace itself
(``SGLANG_ECHO_SIMULATE``, :mod:`sglang_echo.integration.simulate`), and ``load_format="dummy"``
gives it random weights: then only the simulation can make it match, so the same comparison
checks that a simulated server accepts exactly what the recorded pair accepted.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Optional, Sequence

from sglang_echo.core.factory import PolicyConfig

from .drafter import RecordedDrafter
from .simulate import replay_offline
from .trace import Trace


def server_env(policy: str, cfg: PolicyConfig, drafter: str, calibration: Optional[Path]) -> dict[str, str]:
    """The ECHO settings under which the server builds the policy ``replay`` builds from ``cfg``."""
    static = policy == "static-tree"  # the server's static tree is W_max wide with `width` nodes
    env = {
        "SGLANG_ECHO_POLICY": policy,
        "SGLANG_ECHO_DRAFTER": drafter,
        "SGLANG_ECHO_K_MAX": str(cfg.k_max),
        "SGLANG_ECHO_MAX_DEPTH": str(cfg.max_depth),
        "SGLANG_ECHO_W_DEF": str(cfg.w_def),
        "SGLANG_ECHO_W_MAX": str(cfg.topk if static else cfg.w_max),
        "SGLANG_ECHO_FIXED_TAU": str(cfg.fixed_tau),
    }
    if static:
        env["SGLANG_ECHO_WIDTH"] = str(cfg.total_tokens)
    if calibration is not None:
        env["SGLANG_ECHO_CALIBRATION"] = str(Path(calibration).resolve())
    return env


def _histogram(values) -> list[int]:
    """sglang's layout: ``h[v]`` = how many steps had value ``v``."""
    c = Counter(int(v) for v in values)
    return [c.get(v, 0) for v in range(max(c, default=-1) + 1)]


def _trim(h: Sequence[int]) -> list[int]:
    h = list(h or [])
    while h and h[-1] == 0:
        h.pop()
    return h


def validate_server(
    trace: Trace,
    policies: dict,
    cfg: PolicyConfig,
    prompts: Sequence[int],
    *,
    port: int,
    calibration: Optional[Path] = None,
    max_new: Optional[int] = None,
    eos_id: Optional[int] = None,
    simulate: Optional[Path] = None,
    load_format: Optional[str] = None,
    progress=print,
) -> list[dict]:
    """One row per policy (``policies``: name -> the replay's :class:`TreePolicy`); ``simulate``:
    the trace's stem, to serve in simulated-acceptance mode (module docstring)."""
    from sglang_echo.serve.client import generate
    from sglang_echo.serve.flags import ServerOptions
    from sglang_echo.serve.server import SGLangServer

    meta = trace.meta
    max_new = max_new or meta.max_new
    recorded = RecordedDrafter(trace)  # one per run, as validate(): it indexes the whole trace
    rows = []
    for name, policy in policies.items():
        env = server_env(name, cfg, meta.drafter, calibration)
        if simulate is not None:
            env["SGLANG_ECHO_SIMULATE"] = str(Path(simulate).resolve())
        opts = ServerOptions(
            model_path=Path(meta.target),
            port=port,
            spec="echo",
            dtype="float32",
            draft_path=Path(meta.draft) if meta.draft else None,
            enable_metrics=True,
            extra_env=tuple(sorted(env.items())),
            load_format=load_format,
        )
        row = {
            "policy": name,
            "simulated": simulate is not None,
            "requests": 0,
            "steps": 0,
            "step_mismatch": 0,
            "accept_mismatch": 0,
            "size_mismatch": 0,
            "output_mismatch": 0,
            "first_mismatch": None,
        }
        with SGLangServer(opts) as srv:
            for p in prompts:
                got = generate(srv.base_url, input_ids=trace.prompt(p).tolist(), max_new_tokens=max_new)
                rep = replay_offline(
                    trace, policy, [p], k_max=cfg.k_max, max_new=max_new, eos_id=eos_id, drafter=recorded
                )
                n = trace.stream_length(p, max_new, eos_id)
                server = {
                    "steps": int(got.meta.get("spec_verify_ct", 0)),
                    "accepted": _trim(got.meta.get("spec_correct_drafts_histogram")),
                    "sizes": _trim(got.meta.get("spec_cap_lens_histogram")),
                }
                replay = {
                    "steps": rep.steps,
                    "accepted": _histogram(int(a[0]) for a in rep.accept_len),
                    "sizes": _histogram(int(s[0]) for s in rep.tree_size),
                }
                bad = {
                    "step_mismatch": server["steps"] != replay["steps"],
                    "accept_mismatch": server["accepted"] != replay["accepted"],
                    "size_mismatch": server["sizes"] != replay["sizes"],
                    "output_mismatch": got.output_ids != trace.output(p)[:n].tolist(),
                }
                for k, v in bad.items():
                    row[k] += int(v)
                if any(bad.values()) and row["first_mismatch"] is None:
                    row["first_mismatch"] = {"prompt": p, "server": server, "replay": replay}
                row["requests"] += 1
                row["steps"] += replay["steps"]
        row["exact"] = not any(row[k] for k in ("step_mismatch", "accept_mismatch", "size_mismatch", "output_mismatch"))
        progress(
            f"[echo-replay] server {name}: {row['requests']} requests, {row['steps']} steps, "
            f"{'exact' if row['exact'] else 'MISMATCH ' + str(row['first_mismatch'])}"
        )
        rows.append(row)
    return rows
