"""Run in a subprocess by test_registration.py (the CPU engine env must be set before sglang
imports): parse and resolve sglang ServerArgs with ECHO, print the outcome as JSON."""

import json
import sys


def resolve(argv):
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.server_args import prepare_server_args

    try:
        sa = prepare_server_args(argv)
        sa.resolve_once()
    except Exception as e:  # noqa: BLE001 - reported to the test
        return {"error": f"{type(e).__name__}: {e}"}
    v = resolving_view(sa)
    keys = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
            "speculative_num_draft_tokens", "max_running_requests", "disable_overlap_schedule",
            "enable_mixed_chunk")
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
