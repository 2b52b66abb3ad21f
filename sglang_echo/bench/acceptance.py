"""`echo-bench acceptance`: acceptance (MAT) and step cost of tree policies, offline.

Runs the engine-agnostic speculative loop (:mod:`sglang_echo.eval`) with an HF transformers
target on every (prompt set, policy) pair and checks that every output equals plain greedy
decoding (any mismatch is printed loudly and the command exits non-zero). Per row: MAT (mean
accepted tokens per request per step, bonus included), verified tokens per step (roots included),
draft and verify milliseconds per step, and end-to-end generated tokens per second.

    echo-bench acceptance --model DIR --drafter eagle3 --draft DIR \\
        --policies chain6,static-tree,echo --prompts humaneval,chat --per-set 20 \\
        --max-new-tokens 128 --batch 8 --out benchmarks/results/acceptance-eagle3

``--per-set N`` takes N prompts of each set, ``--num-prompts N`` N in all (spread over the sets).

Policy names: ``chainN`` (a chain of depth N), ``static-tree`` (EAGLE-3's 8 steps / top-10 /
60 tokens unless ``--max-depth``/``--topk``/``--total-tokens`` say otherwise), and every name of
:data:`sglang_echo.core.factory.POLICIES` (``echo`` = ECHO with the default gating, or the
``--calibration`` file's; by default the one shipped for the target and drafter). Budgeted
policies share ``--k-max`` verified tokens per step over the batch (default ``8 * batch``).
``ar`` (plain decoding, the reference) is always the first row.
``dart-tree`` is DART's static tree (Algorithm 1: beam 20, 25 candidates per position, 59 nodes;
``--drafter dart`` only; ``--ngram FILE`` / ``--no-ngram`` choose DART's n-gram pruning).
``--hybrid`` drafts every other policy's trees with the head and the n-gram drafter together
(:mod:`sglang_echo.drafters.hybrid`).
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from ..cli_args import CommandError, prompt_counts, run
from ..models.prompts import load
from ..models.prompts import set_name as label
from ..platform.packed_linear import pack_linears
from ..serve.flags import resolve_device
from .acceptance_args import build_policy, gating_calibration, parse_args, shipped_draft

__all__ = [
    "Row",
    "build_drafter",
    "build_policy",
    "gating_calibration",
    "load_prompt_ids",
    "main",
    "markdown",
    "shipped_draft",
]


@dataclass
class Row:
    """Totals of one (prompt set, policy) over every batch."""

    prompts: str
    drafter: str
    policy: str
    requests: int = 0
    steps: int = 0
    request_steps: int = 0
    committed: int = 0  # sum of (L_i + 1) over request-steps
    verified: int = 0
    max_verified: int = 0
    drafted: int = 0
    accepted: int = 0
    generated: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0
    mismatches: list = field(default_factory=list)

    def add(self, res) -> None:
        self.requests += len(res.tokens)
        self.steps += res.steps
        self.request_steps += res.request_steps
        self.committed += int(sum(int((a[a >= 0] + 1).sum()) for a in res.accept_len))
        self.verified += sum(res.verified)
        self.max_verified = max([self.max_verified, *res.verified_total])
        self.drafted += res.totals.drafted
        self.accepted += res.totals.accepted
        self.generated += res.num_generated
        self.draft_s += sum(res.draft_s)
        self.verify_s += sum(res.verify_s)
        self.total_s += res.total_s

    def summary(self) -> dict:
        per_step = lambda x: x / self.steps if self.steps else 0.0  # noqa: E731
        return {
            "prompts": self.prompts,
            "drafter": self.drafter,
            "policy": self.policy,
            "requests": self.requests,
            "steps": self.steps,
            "mat": self.committed / self.request_steps if self.request_steps else 0.0,
            "verified_per_step": per_step(self.verified),
            "max_verified_per_step": self.max_verified,
            "yield": self.accepted / self.drafted if self.drafted else 0.0,
            "draft_ms_per_step": 1e3 * per_step(self.draft_s),
            "verify_ms_per_step": 1e3 * per_step(self.verify_s),
            "tokens_per_s": self.generated / self.total_s if self.total_s else 0.0,
            "generated": self.generated,
            "mismatches": len(self.mismatches),
        }


COLUMNS = (
    ("prompts", "prompts", "{}"),
    ("drafter", "drafter", "{}"),
    ("policy", "policy", "{}"),
    ("mat", "MAT", "{:.3f}"),
    ("verified_per_step", "verified/step", "{:.1f}"),
    ("yield", "yield", "{:.3f}"),
    ("draft_ms_per_step", "draft ms/step", "{:.2f}"),
    ("verify_ms_per_step", "verify ms/step", "{:.2f}"),
    ("tokens_per_s", "tok/s", "{:.1f}"),
    ("mismatches", "mismatches", "{}"),
)


def markdown(rows: list[dict]) -> str:
    head = "| " + " | ".join(c[1] for c in COLUMNS) + " |"
    sep = "| " + " | ".join("---" for _ in COLUMNS) + " |"
    body = ["| " + " | ".join(fmt.format(r[k]) for k, _, fmt in COLUMNS) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def build_drafter(
    kind: str, draft: Optional[Path], model, device: torch.device, ngram: Optional[Path] = None, use_ngram: bool = True
):
    """The drafter (imported lazily) and the target layers it reads."""
    if kind == "ngram":
        from ..drafters.ngram import NGramDrafter

        d = NGramDrafter()
        return d, tuple(getattr(d, "captured_layers", ()))
    if kind == "eagle3":
        if draft is None:
            raise CommandError("--drafter eagle3 needs --draft DIR (an EAGLE-3 head checkpoint)")
        from ..drafters.eagle3 import Eagle3Drafter
        from ..drafters.eagle3_head import Eagle3Head

        embed = model.get_input_embeddings().weight
        head = Eagle3Head.load(draft, embed=embed, num_target_layers=model.config.num_hidden_layers).to(device)
        pack_linears(head)  # as the CPU server runs the draft model
        d = Eagle3Drafter(head)
        return d, tuple(getattr(d, "captured_layers", head.cfg.aux_layer_ids))
    if kind == "dart":
        if draft is None:
            raise CommandError("--drafter dart needs --draft DIR (a DART head checkpoint)")
        from ..drafters.dart import load_dart_drafter
        from ..drafters.ngram_trie import NGramTrieError

        eos = model.config.eos_token_id
        try:
            d = load_dart_drafter(
                draft,
                model.get_input_embeddings().weight,
                model.config.num_hidden_layers,
                ngram=ngram,
                use_ngram=use_ngram,
                eos_id=eos[0] if isinstance(eos, list) else eos,
                device=device,
            )
        except NGramTrieError as e:
            raise CommandError(f"--drafter dart: {e}") from None
        pack_linears(d.head)
        return d, d.captured_layers
    if kind == "dflash":
        if draft is None:
            raise CommandError("--drafter dflash needs --draft DIR (a DFlash draft checkpoint)")
        from ..drafters.dflash import load_dflash_drafter

        out = model.get_output_embeddings()
        d = load_dflash_drafter(
            draft,
            model.get_input_embeddings().weight,
            None if out is None else out.weight,
            num_target_layers=model.config.num_hidden_layers,
            device=device,
        )
        return d, d.captured_layers
    raise CommandError(f"unknown drafter {kind!r}")


def load_prompt_ids(name: str, limit: int, tokenizer, max_prompt_len: Optional[int]) -> list[torch.Tensor]:
    out = []
    for p in load(name, limit):
        ids = tokenizer(p.as_text(tokenizer), add_special_tokens=not p.is_chat)["input_ids"]
        if max_prompt_len:
            ids = ids[-max_prompt_len:]
        out.append(torch.tensor(ids, dtype=torch.long))
    return out


def _first_diff(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__.splitlines()[0])
    return run("echo-bench acceptance", lambda: _measure(args, argv), args.debug)


def _measure(args: argparse.Namespace, argv: list[str] | None) -> int:
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..eval import HFTarget, autoregressive_generate, speculative_generate

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(resolve_device(args.device))
    k_max = args.k_max or 8 * args.batch
    gating_source = args.gating[1]
    print(f"[acceptance] ECHO gates with {gating_source}")
    policies = args.built
    tokenizer = AutoTokenizer.from_pretrained(str(args.model))
    model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=getattr(torch, args.dtype)).to(device)
    drafter, captured = build_drafter(
        args.drafter, args.draft, model, device, ngram=args.ngram, use_ngram=not args.no_ngram
    )
    for p in policies.values():
        if hasattr(p, "bind"):  # dart-tree builds its trees with the drafter itself
            p.bind(drafter)
    if args.hybrid:
        if args.drafter == "ngram":
            raise CommandError("--hybrid adds the n-gram drafter to a head: pick --drafter eagle3, dart or dflash")
        from ..drafters.hybrid import HybridDrafter

        drafter = HybridDrafter(drafter)
    target = HFTarget(model, captured)
    eos = None if args.ignore_eos else tokenizer.eos_token_id

    counts = prompt_counts(args.prompts, args.per_set, args.num_prompts)
    sets = {label(n): load_prompt_ids(n, k, tokenizer, args.max_prompt_len) for n, k in zip(args.prompts, counts)}
    batches = {n: [ids[i : i + args.batch] for i in range(0, len(ids), args.batch)] for n, ids in sets.items()}
    # Warm-up (allocator, kernels, lazy inits) so the first timed row is not penalised.
    first = next((b for bs in batches.values() for b in bs), None)
    if first is not None:
        autoregressive_generate(target, first, min(4, args.max_new_tokens), eos)
        speculative_generate(target, drafter, next(iter(policies.values())), first, min(4, args.max_new_tokens), eos)

    total = sum(len(bs) for bs in batches.values()) * (1 + len(policies))
    rows: list[Row] = []
    bar = tqdm(total=total, desc="acceptance", unit="batch")
    for set_name, bs in batches.items():
        ar_row = Row(set_name, "-", "ar")
        refs = []
        for batch in bs:
            bar.set_postfix_str(f"{set_name} ar")
            res = autoregressive_generate(target, batch, args.max_new_tokens, eos)
            ar_row.add(res)
            refs.append(res.tokens)
            bar.update()
        rows.append(ar_row)
        for pname, policy in policies.items():
            row = Row(set_name, drafter.name, pname)
            for i, batch in enumerate(bs):
                bar.set_postfix_str(f"{set_name} {pname}")
                res = speculative_generate(target, drafter, policy, batch, args.max_new_tokens, eos)
                row.add(res)
                for b, (got, want) in enumerate(zip(res.tokens, refs[i])):
                    if got != want:
                        j = _first_diff(got, want)
                        row.mismatches.append(
                            {
                                "prompt": i * args.batch + b,
                                "first_diff": j,
                                "got": got[j : j + 8],
                                "want": want[j : j + 8],
                            }
                        )
                        tqdm.write(
                            f"!!! MISMATCH {set_name}/{pname} prompt {i * args.batch + b}: "
                            f"output differs from greedy AR at token {j}: {got[j : j + 8]} vs {want[j : j + 8]}",
                            file=sys.stderr,
                        )
                bar.update()
            rows.append(row)
    bar.close()

    summaries = [r.summary() for r in rows]
    table = markdown(summaries)
    print(table)
    mismatches = {f"{r.prompts}/{r.policy}": r.mismatches for r in rows if r.mismatches}
    if args.out is not None:
        stem = args.out.with_suffix("") if args.out.suffix in (".json", ".md") else args.out
        stem.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "command": "echo-bench acceptance " + shlex.join(sys.argv[1:] if argv is None else argv),
            "machine": platform.node(),
            "device": torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else f"cpu ({torch.get_num_threads()} threads)",
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "target": str(args.model),
            "draft": str(args.draft) if args.draft else None,
            "captured_layers": list(captured),
            "drafter_config": drafter.describe() if hasattr(drafter, "describe") else None,
            "k_max": k_max,
            "calibration": gating_source,
            "policies": {n: p.name for n, p in policies.items()},
            "eos_id": eos,
            "args": {
                k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("gating", "built")
            },
        }
        Path(f"{stem}.json").write_text(
            json.dumps({**meta, "rows": summaries, "mismatch_details": mismatches}, indent=2) + "\n"
        )
        Path(f"{stem}.md").write_text(f"`{meta['command']}` on {meta['device']}\n\n{table}\n")
        print(f"wrote {stem}.json and {stem}.md")
    if mismatches:
        n = sum(len(v) for v in mismatches.values())
        print(f"!!! {n} speculative outputs differ from greedy AR decoding: {', '.join(mismatches)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
