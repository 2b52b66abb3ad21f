"""Text the prompt pool takes from the running interpreter's standard library (no download).

The sources are read in sorted order with ``ast`` (nothing is imported), so the same Python gives
the same :class:`StdlibText`. What comes out: HumanEval-shaped function stubs, one-line task
descriptions, prose passages of docstrings, and documented public functions with their names
(the questions of the retrieval and question-answering kinds are about them).
"""

from __future__ import annotations

import ast
import sysconfig
from dataclasses import dataclass
from functools import cache
from pathlib import Path

_SKIP_DIRS = {
    "test",
    "tests",
    "idlelib",
    "lib2to3",
    "tkinter",
    "turtledemo",
    "site-packages",
    "ensurepip",
    "pydoc_data",
    "encodings",
    "__phello__",
    "msilib",
}


@dataclass(frozen=True)
class Documented:
    """A public function or method with a prose docstring."""

    name: str  # qualified: ``module.function`` or ``module.Class.method``
    params: tuple[str, ...]  # parameter names, ``self``/``cls`` dropped
    doc: str  # the docstring, its paragraphs joined by blank lines


@dataclass(frozen=True)
class StdlibText:
    stubs: tuple[str, ...]  # ``def f(args):`` plus its docstring, nothing else (a raw completion)
    descriptions: tuple[str, ...]  # "what the function does (call it `f`)"
    passages: tuple[str, ...]  # 250-1500 characters of docstring prose
    documented: tuple[Documented, ...]


@cache
def stdlib_text() -> StdlibText:
    """Everything the pool takes from the stdlib sources, deduplicated, in a stable order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    stubs, descriptions, passages, documented = {}, {}, {}, {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if set(rel.parts) & _SKIP_DIRS:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        _add_passage(passages, ast.get_docstring(tree))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                _add_passage(passages, ast.get_docstring(node))
                _add_function(stubs, descriptions, documented, node, f"{module}.{node.name}", method=False)
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                _add_passage(passages, ast.get_docstring(node))
                for sub in node.body:
                    if isinstance(sub, ast.FunctionDef):
                        _add_passage(passages, ast.get_docstring(sub))
                        qual = f"{module}.{node.name}.{sub.name}"
                        _add_function(stubs, descriptions, documented, sub, qual, method=True)
    return StdlibText(tuple(stubs), tuple(descriptions), tuple(passages), tuple(documented.values()))


def _add_function(
    stubs: dict, descriptions: dict, documented: dict, node: ast.FunctionDef, qualname: str, method: bool
) -> None:
    doc = ast.get_docstring(node)
    if node.name.startswith("_") or not doc or not 40 <= len(doc) <= 700:
        return
    args = node.args
    if method and args.args and args.args[0].arg in ("self", "cls"):
        args = ast.arguments(
            args.posonlyargs,
            args.args[1:],
            args.vararg,
            args.kwonlyargs,
            args.kw_defaults,
            args.kwarg,
            args.defaults[-len(args.args[1:]) :] if args.args[1:] else [],
        )
    body = "\n".join(("    " + line).rstrip() for line in doc.splitlines())
    stubs[f'def {node.name}({ast.unparse(args)}):\n    """{body.lstrip()}\n    """\n'] = None
    first = doc.split("\n\n")[0].replace("\n", " ").strip().rstrip(".")
    if 20 <= len(first) <= 160 and first[0].isupper() and " " in first:
        descriptions[f"{first[0].lower()}{first[1:]} (call it `{node.name}`)"] = None
    prose = _prose(doc)
    if len(prose) >= 80 and qualname not in documented:
        params = tuple(a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))
        documented[qualname] = Documented(qualname, params, prose)


def _prose(doc: str) -> str:
    """A docstring's prose paragraphs (no doctests, tables or indented blocks), blank-line separated."""
    paragraphs = [p.replace("\n", " ").strip() for p in doc.split("\n\n")]
    return "\n\n".join(p for p in paragraphs if len(p) > 60 and not any(c in p for c in (">>>", "::", "  ", "|")))


def _add_passage(passages: dict, doc: str | None) -> None:
    """A docstring's prose, if there is enough of it to summarize."""
    if not doc:
        return
    text = _prose(doc)
    if 250 <= len(text) <= 1500:
        passages[text] = None
