"""How often does the n-gram drafter's proposal come true? Its confidence model, fitted and checked.

The n-gram drafter (``sglang_echo/drafters/ngram.py``) gives a child that followed ``c`` of the
``n`` earlier occurrences of a length-``m`` suffix the probability ``q = c / (n + alpha) * r_m``.
ECHO ranks those against a head's softmax probabilities (gates, path scores, hybrid merges), so
``q`` should be the chance that the target really writes that token next. This replays the
target's own greedy answers (a self-distillation folder, ``echo-train-drafter``'s data: plain
decoding's tokens), asks the drafter at every answer position for its top-``k`` children of the
committed history, and records whether each is the token that came next. It then fits ``alpha``
and ``r_1 .. r_max`` by maximum likelihood on the first shards and reports the negative
log-likelihood of the shipped parameters and of the fit on the held-out shards, with a table of
observed against predicted rates::

    python benchmarks/ngram_confidence.py --data ~/.cache/sglang-echo/train/smollm2-sd \\
        --fit-shards 0-3 --check-shards 4-5 --out benchmarks/results/ngram-confidence/smollm2
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
from tqdm import tqdm

from sglang_echo.drafters.ngram import NGramDrafter
from sglang_echo.training.shards import read_shard, shard_path

FIELDS = ("m", "c", "n", "rank", "hit")


def observe(rows: list[tuple[torch.Tensor, int]], max_ngram: int, k: int) -> torch.Tensor:
    """``[N, 5]`` (m, c, n, rank, hit) for the top-``k`` children at every answer position."""
    out: list[tuple[int, int, int, int, int]] = []
    for seq, plen in tqdm(rows, desc="replaying answers", unit="answer"):
        ids = seq.tolist()
        drafter = NGramDrafter(max_ngram=max_ngram)
        drafter.start([seq[:plen]])
        for pos in range(plen, len(ids)):
            found = drafter.match(0)
            if found is not None:
                m, counts = found
                n = sum(c for _, c in counts)
                out.extend((m, c, n, r, int(tok == ids[pos])) for r, (tok, c) in enumerate(counts[:k]))
            # The catch-up contract (drafters/base.py): the first repeats prompt[1:].
            new = ids[1 : pos + 1] if pos == plen else ids[pos : pos + 1]
            drafter.catch_up([torch.tensor(new)], None)
    return torch.tensor(out, dtype=torch.float64).reshape(-1, len(FIELDS))


def predict(obs: torch.Tensor, alpha: torch.Tensor, reliability: torch.Tensor) -> torch.Tensor:
    m, c, n = obs[:, 0].long(), obs[:, 1], obs[:, 2]
    return c / (n + alpha) * reliability[m - 1]


def nll(obs: torch.Tensor, p: torch.Tensor) -> float:
    p, hit = p.clamp(1e-6, 1 - 1e-6), obs[:, 4]
    return float(-(hit * p.log() + (1 - hit) * (1 - p).log()).mean())


def fit(obs: torch.Tensor, max_ngram: int, steps: int = 2000) -> tuple[float, list[float]]:
    """Maximum-likelihood ``alpha > 0`` and ``r_m`` in (0, 1) (Adam on log alpha and logit r)."""
    log_alpha = torch.zeros((), dtype=torch.float64, requires_grad=True)
    logit_r = torch.zeros(max_ngram, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([log_alpha, logit_r], lr=0.05)
    hit = obs[:, 4]
    for _ in range(steps):
        p = predict(obs, log_alpha.exp(), torch.sigmoid(logit_r)).clamp(1e-6, 1 - 1e-6)
        loss = -(hit * p.log() + (1 - hit) * (1 - p).log()).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(log_alpha.detach().exp()), torch.sigmoid(logit_r.detach()).tolist()


def table(obs: torch.Tensor, models: dict[str, torch.Tensor], min_count: int = 100) -> list[str]:
    """Observed vs predicted rate of the top child per (m, c, n) with at least ``min_count`` cases."""
    groups: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for i, (m, c, n, rank, _) in enumerate(obs.long().tolist()):
        if rank == 0:
            groups[(m, c, n)].append(i)
    head = "| m | c | n | cases | observed | " + " | ".join(models) + " |"
    lines = [head, "|" + " --- |" * (5 + len(models))]
    for (m, c, n), idx in sorted(groups.items()):
        if len(idx) < min_count:
            continue
        sel = torch.tensor(idx)
        pred = " | ".join(f"{float(p[sel].mean()):.3f}" for p in models.values())
        lines.append(f"| {m} | {c} | {n} | {len(idx)} | {float(obs[sel, 4].mean()):.3f} | {pred} |")
    return lines


def shard_range(spec: str) -> range:
    lo, _, hi = spec.partition("-")
    return range(int(lo), int(hi or lo) + 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="a self-distillation folder (shard-*.safetensors)")
    ap.add_argument("--fit-shards", default="0-3", help="shards the parameters are fitted on (A-B)")
    ap.add_argument("--check-shards", default="4-5", help="held-out shards they are checked on (A-B)")
    ap.add_argument("--max-ngram", type=int, default=4)
    ap.add_argument("--k", type=int, default=4, help="children per position (the drafter's w_max)")
    ap.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="NAME=ALPHA:R1/R2/..",
        help="another parameter set to check, e.g. exp-prior=1:0.632/0.865/0.950/0.982",
    )
    ap.add_argument("--out", type=Path, required=True, help="writes OUT.json and OUT.md")
    args = ap.parse_args(argv)
    data = {}
    for split, spec in (("fit", args.fit_shards), ("check", args.check_shards)):
        paths = [shard_path(args.data, i) for i in shard_range(spec)]
        if missing := [str(p) for p in paths if not p.is_file()]:
            print(f"error: no such shard: {', '.join(missing)}", file=sys.stderr)
            return 2
        data[split] = observe([row for p in paths for row in read_shard(p)], args.max_ngram, args.k)
    alpha, reliability = fit(data["fit"], args.max_ngram)
    shipped = NGramDrafter(max_ngram=args.max_ngram)
    params = {
        "shipped": (shipped.alpha, list(shipped.reliability)),
        "fitted": (alpha, reliability),
    }
    for spec in args.also:
        try:
            name, _, rest = spec.partition("=")
            a, _, rs = rest.partition(":")
            params[name] = (float(a), [float(x) for x in rs.split("/")])
            if len(params[name][1]) != args.max_ngram:
                raise ValueError(f"{args.max_ngram} values of r_m expected")
        except ValueError as e:
            print(f"error: --also {spec!r}: {e}", file=sys.stderr)
            return 2
    check = data["check"]
    preds = {name: predict(check, torch.tensor(a), torch.tensor(r)) for name, (a, r) in params.items()}
    report = {
        "command": "python benchmarks/ngram_confidence.py " + " ".join(argv or sys.argv[1:]),
        "observations": {split: len(obs) for split, obs in data.items()},
        "parameters": {name: {"alpha": a, "reliability": r} for name, (a, r) in params.items()},
        "held_out_nll": {name: nll(check, p) for name, p in preds.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    md = [
        "# n-gram drafter confidence: observed against predicted",
        "",
        f"`{report['command']}`",
        "",
        "| parameters | alpha | r_m | held-out NLL |",
        "| --- | --- | --- | --- |",
        *(
            f"| {name} | {a:.3f} | {' / '.join(f'{x:.3f}' for x in r)} | {report['held_out_nll'][name]:.4f} |"
            for name, (a, r) in params.items()
        ),
        "",
        "Top child per (match length m, its count c, all continuations n), held-out shards:",
        "",
        *table(check, preds),
    ]
    args.out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
