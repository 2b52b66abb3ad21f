"""Manual end-to-end check (not collected by pytest): start the real sglang server on CPU with
`echo_torch`, without speculation and with NGRAM / EAGLE3, and compare greedy outputs.

    SGLANG_USE_CPU_ENGINE=1 python tests/platform/serve_check.py /tmp/echo_tiny [none ngram eagle3]
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PORT = 31011
PROMPTS = [
    "The quick brown fox",
    "def fibonacci(n):",
    "SGLang serves language models anywhere",
    "the lazy dog jumps over the quick brown fox. the lazy dog",
    "fibonacci(n - 1) + fibonacci(n - 2) fibonacci(n - 1) +",
    "Write a haiku about a CPU.",
]
SPEC = {
    "none": [],
    "ngram": ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8"],
    "eagle3": ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
               "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6"],
    "eagle3_chain": ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
                     "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"],
}


def launch_cmd(model: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model),
            "--device", "cpu", "--host", "127.0.0.1", "--port", str(PORT),
            "--max-total-tokens", "8192", "--attention-backend", "echo_torch",
            "--dtype", "float32", "--disable-cuda-graph", "--skip-server-warmup", *extra]


def post(path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def wait_up(proc: subprocess.Popen, timeout: float = 240) -> float:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError("server exited")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{PORT}/model_info", timeout=2)
            return time.time() - t0
        except Exception:
            time.sleep(0.5)
    raise TimeoutError


def generate(prompt: str, max_new: int = 32) -> list[int]:
    out = post("/generate", {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True},
                             "return_logprob": True, "top_logprobs_num": 0})
    return [t[1] for t in out["meta_info"]["output_token_logprobs"]]


def run(root: Path, name: str) -> dict:
    extra = list(SPEC[name])
    if name.startswith("eagle3"):
        extra += ["--speculative-draft-model-path", str(root / "eagle3")]
    log = open(f"/tmp/serve_check_{name}.log", "w")
    proc = subprocess.Popen(launch_cmd(root / "llama", extra), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        startup = wait_up(proc)
        chat = post("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                             "max_tokens": 8, "temperature": 0})
        assert chat["choices"][0]["message"]["content"] is not None
        t0 = time.time()
        with cf.ThreadPoolExecutor(len(PROMPTS)) as ex:  # concurrent requests
            outs = list(ex.map(generate, PROMPTS))
        dt = time.time() - t0
        seq = [generate(p, 64) for p in PROMPTS[:2]]
        return {"startup_s": round(startup, 1), "outputs": outs, "concurrent_s": round(dt, 2),
                "tok_per_s_concurrent": round(sum(map(len, outs)) / dt, 1), "seq": seq}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


if __name__ == "__main__":
    root = Path(sys.argv[1])
    names = sys.argv[2:] or ["none", "ngram", "eagle3"]
    results = {n: run(root, n) for n in names}
    base = results.get("none")
    for n, r in results.items():
        same = None if base is None else (r["outputs"] == base["outputs"] and r["seq"] == base["seq"])
        print(f"{n}: startup={r['startup_s']}s concurrent={r['concurrent_s']}s "
              f"tok/s={r['tok_per_s_concurrent']} matches_no_spec={same}")
    json.dump(results, open("/tmp/serve_check.json", "w"))
