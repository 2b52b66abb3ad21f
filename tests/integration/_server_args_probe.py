"""Run in a subprocess (the CPU engine env must be set before sglang imports): parse and resolve
sglang ServerArgs with ECHO, print the outcome as JSON. Tests call :func:`probe`."""

import json
import os
import subprocess
import sys
from pathlib import Path


def probe(cases: dict, cwd: Path) -> dict:
    """``{name: {"argv": [...], "env": {...}}}`` -> ``{name: resolved settings or {"error": msg}}``."""
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1"}
    p = subprocess.run(
        [sys.executable, __file__, json.dumps(cases)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=cwd,
        check=False,
    )
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("PROBE-RESULT ")]
    assert line, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(line[0].split(" ", 1)[1])


def resolve(argv):
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.server_args import prepare_server_args

    try:
        sa = prepare_server_args(argv)
        sa.resolve_once()
    except Exception as e:  # noqa: BLE001 - reported to the test
        return {"error": f"{type(e).__name__}: {e}"}
    v = resolving_view(sa)
    keys = (
        "speculative_algorithm",
        "speculative_num_steps",
        "speculative_eagle_topk",
        "speculative_num_draft_tokens",
        "max_running_requests",
        "disable_overlap_schedule",
        "enable_mixed_chunk",
    )
    return {k: getattr(v, k) for k in keys}


def main():
    import os

    from sglang.srt.plugins import load_plugins

    load_plugins()
    cases = json.loads(sys.argv[1])
    out = {}
    for name, case in cases.items():
        env = case.get("env", {})
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            out[name] = resolve(case["argv"])
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    print("PROBE-RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
