"""Tables for ``echo-replay run``: a rich table on the terminal, Markdown and JSON on disk."""

from __future__ import annotations

from typing import Sequence

# (key, header, format); the throughput keys come from the first cost model.
COLUMNS = (
    ("policy", "policy", "{}"),
    ("batch", "B", "{}"),
    ("k_max", "K_max", "{}"),
    ("mat", "MAT", "{:.3f}"),
    ("accepted_per_step", "accepted/step", "{:.2f}"),
    ("committed_per_step", "committed/step", "{:.2f}"),
    ("verified_per_step", "verified/step", "{:.1f}"),
    ("verified_over_k_max", "verified/K_max", "{:.2f}"),
    ("oracle_accepted_per_step", "oracle/step", "{:.2f}"),
    ("oracle_fraction", "oracle frac", "{:.3f}"),
    ("ranked_accepted_per_step", "ranked/step", "{:.2f}"),
    ("ranked_fraction", "ranked frac", "{:.3f}"),
    ("draft_ms_per_step", "draft ms", "{:.1f}"),
    ("verify_ms_per_step", "verify ms", "{:.1f}"),
    ("control_ms_per_step", "control ms", "{:.1f}"),
    ("tokens_per_s", "tok/s", "{:.1f}"),
    ("ar_tokens_per_s", "AR tok/s", "{:.1f}"),
    ("speedup", "speedup", "{:.2f}"),
    ("coverage", "coverage", "{:.4f}"),
)


def flat_row(row: dict) -> dict:
    """A result row with its first cost model's throughput figures merged in (for the tables)."""
    first = (row.get("throughput") or [{}])[0]
    return {**row, **{k: v for k, v in first.items() if k != "cost"}}


def _cell(row: dict, key: str, fmt: str) -> str:
    v = row.get(key)
    return "-" if v is None else fmt.format(v)


def markdown(rows: Sequence[dict]) -> str:
    flat = [flat_row(r) for r in rows]
    head = "| " + " | ".join(h for _, h, _ in COLUMNS) + " |"
    sep = "| " + " | ".join("---" for _ in COLUMNS) + " |"
    body = ["| " + " | ".join(_cell(r, k, f) for k, _, f in COLUMNS) + " |" for r in flat]
    return "\n".join([head, sep, *body])


def comparison(rows: Sequence[dict], policies: Sequence[str] = ("echo", "static-tree")) -> str:
    """Per batch size: oracle fraction and modelled speedup of the named policies side by side."""
    by = {(r["policy_arg"], r["batch"]): flat_row(r) for r in rows}
    batches = sorted({r["batch"] for r in rows})
    present = [p for p in policies if any((p, b) in by for b in batches)]
    head = "| B | " + " | ".join(f"{p} oracle frac | {p} speedup" for p in present) + " |"
    sep = "| --- |" + " --- | --- |" * len(present)
    lines = [head, sep]
    for b in batches:
        cells = []
        for p in present:
            r = by.get((p, b), {})
            cells += [_cell(r, "oracle_fraction", "{:.3f}"), _cell(r, "speedup", "{:.2f}")]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def print_table(rows: Sequence[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for _, h, _ in COLUMNS:
        table.add_column(h, justify="right" if h not in ("policy",) else "left")
    for r in rows:
        f = flat_row(r)
        table.add_row(*[_cell(f, k, fmt) for k, _, fmt in COLUMNS])
    Console(width=240).print(table)
