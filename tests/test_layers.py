"""The layering in docs/structures.md holds: no module imports a layer above its own (not even inside
a function), and no import-time cycle exists between modules."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {
    "sglang_echo": ROOT / "sglang_echo",
    "sglang_echo.kernels": ROOT / "kernels",
    "sglang_echo.calibration": ROOT / "calibration",
}


def layer_table() -> list[list[str]]:
    """The modules of each layer, bottom first, as docs/structures.md lists them."""
    text = (ROOT / "docs/structures.md").read_text()
    rows = text.split("<!-- layers:")[1].split("<!-- /layers -->")[0]
    layers = []
    for line in rows.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.match(r"\d+ ", cells[0]):
            layers.append(re.findall(r"`([\w.]+)`", cells[1]))
    return layers


def modules() -> dict[str, Path]:
    out = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            if package == "sglang_echo" and path.is_relative_to(ROOT / "sglang_echo/kernels"):
                continue
            parts = list(path.relative_to(folder).with_suffix("").parts)
            out[".".join([package] + (parts[:-1] if parts[-1] == "__init__" else parts))] = path
    out.pop("sglang_echo")  # the package's own __init__: a docstring, no imports (checked below)
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int, bool]]:
    """(imported module, line, at import time) of every ``sglang_echo`` import in ``path``."""
    tree = ast.parse(path.read_text())
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    runtime = {id(n) for n in tree.body}  # module-level statements (not in functions, not TYPE_CHECKING)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (
                ".".join(package[: len(package) - node.level + 1] + [node.module or ""]).strip(".")
                if node.level
                else node.module or ""
            )
            found = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out += [(m, node.lineno, id(node) in runtime) for m in found if m.startswith("sglang_echo")]
    return out


def layer_of(module: str, layers: list[list[str]]) -> int | None:
    best = max(
        ((len(p), i) for i, ps in enumerate(layers) for p in ps if module == p or module.startswith(p + ".")),
        default=None,
    )
    return None if best is None else best[1]


def test_the_table_names_every_module_and_the_layers_hold():
    layers, known = layer_table(), modules()
    assert len(layers) >= 5, "docs/structures.md's layer table was not found"
    unplaced = sorted(m for m in known if layer_of(m, layers) is None)
    assert unplaced == [], f"modules in no layer of docs/structures.md: {unplaced}"
    upward = []
    for name, path in known.items():
        for target, line, _ in imports(name, path, known):
            if layer_of(target, layers) > layer_of(name, layers):
                upward.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert upward == [], "imports of a higher layer:\n" + "\n".join(upward)


def test_the_package_root_imports_nothing():
    tree = ast.parse((ROOT / "sglang_echo/__init__.py").read_text())
    assert not [
        n
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        and not (isinstance(n, ast.ImportFrom) and n.module == "__future__")
    ]


def test_no_import_time_cycles():
    known = modules()
    graph = defaultdict(set)
    for name, path in known.items():
        for target, _, at_import in imports(name, path, known):
            if at_import and target in known and target != name and not name.startswith(target + "."):
                graph[name].add(target)
    cycles, state = [], {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(trail[trail.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = "done"

    for name in sorted(known):
        if name not in state:
            visit(name, [name])
    assert cycles == [], "import-time cycles: " + "; ".join(" -> ".join(c) for c in cycles)
