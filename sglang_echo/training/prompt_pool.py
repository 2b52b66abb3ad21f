"""The training prompt pool, assembled offline: templates plus the Python standard library.

Self-distillation only needs *questions*: the target writes the answers. The pool mixes the
shapes the target serves (and the evaluation sets measure) without containing any of their
prompts (tests check that no pool prompt is in `prompts/` or HumanEval):

* ``chat``: templated requests (explain, list, compare, write, plan, advise...) over a few hundred
  subjects, tasks and audiences;
* ``code-chat``: "write a function that ..." requests, from a task list and from the first
  sentence of standard-library docstrings;
* ``code``: raw completions shaped like HumanEval (a signature and a docstring, no chat template),
  from public module-level functions and methods of the standard library;
* ``math``: arithmetic word problems, half with a step-by-step instruction;
* ``summarize``: "summarize this passage" over standard-library module and class docstrings.

Everything is seeded, so a pool is reproducible on the same Python (the stdlib sources are read
from the running interpreter, in sorted order); no download is needed.
"""

from __future__ import annotations

import ast
import random
import sysconfig
from functools import cache
from pathlib import Path

from sglang_echo.models.prompts import Prompt

from .pool_vocab import (
    ACTIVITIES,
    AUDIENCES,
    CHAT_TEMPLATES,
    CODE_TASKS,
    CODE_TEMPLATES,
    FORMATS,
    MATH_TEMPLATES,
    PAIRS,
    PERSONS,
    SUBJECTS,
    TASK_TEMPLATES,
    THINGS,
)

# Share of each source in a pool; a source that runs out of distinct prompts hands its share on.
MIX = {"chat": 0.50, "code-chat": 0.12, "code": 0.16, "math": 0.12, "summarize": 0.10}
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
STEP_BY_STEP = " Think step by step, then give the final answer after '####'."


def _chat(rng: random.Random) -> str:
    if rng.random() < 0.55:
        s, t = rng.sample(SUBJECTS, 2)
        return rng.choice(CHAT_TEMPLATES).format(s=s, t=t, a=rng.choice(AUDIENCES), f=rng.choice(FORMATS))
    a, b = rng.choice(PAIRS)
    return rng.choice(TASK_TEMPLATES).format(
        act=rng.choice(ACTIVITIES),
        thing=rng.choice(THINGS),
        p=rng.choice(PERSONS),
        s=rng.choice(SUBJECTS),
        x=a,
        y=b,
        n=rng.randint(2, 7),
        f=rng.choice(FORMATS),
    )


def _math(rng: random.Random) -> str:
    x, y, z = rng.randint(2, 90), rng.randint(2, 12), rng.randint(20, 400)
    q = rng.choice(MATH_TEMPLATES).format(x=x, y=y, z=z, p=rng.choice(PERSONS).split()[-1].capitalize())
    return q + (STEP_BY_STEP if rng.random() < 0.5 else "")


@cache
def _stdlib() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(function stubs, one-line function descriptions, prose passages) from the stdlib sources."""
    root = Path(sysconfig.get_paths()["stdlib"])
    stubs, descriptions, passages = {}, {}, {}
    for path in sorted(root.rglob("*.py")):
        if set(path.relative_to(root).parts) & _SKIP_DIRS:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        _add_passage(passages, ast.get_docstring(tree))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                _add_passage(passages, ast.get_docstring(node))
                _add_function(stubs, descriptions, node, method=False)
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                _add_passage(passages, ast.get_docstring(node))
                for sub in node.body:
                    if isinstance(sub, ast.FunctionDef):
                        _add_passage(passages, ast.get_docstring(sub))
                        _add_function(stubs, descriptions, sub, method=True)
    return tuple(stubs), tuple(descriptions), tuple(passages)


def _add_function(stubs: dict, descriptions: dict, node: ast.FunctionDef, method: bool) -> None:
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


def _add_passage(passages: dict, doc: str | None) -> None:
    """A docstring's prose paragraphs, if there are enough of them to summarize."""
    if not doc:
        return
    prose = [p.replace("\n", " ").strip() for p in doc.split("\n\n")]
    prose = [p for p in prose if len(p) > 60 and not any(c in p for c in (">>>", "::", "  ", "|"))]
    text = "\n\n".join(prose)
    if 250 <= len(text) <= 1500:
        passages[text] = None


def _draw(source: str, rng: random.Random, stdlib: tuple) -> Prompt | None:
    """One prompt of ``source`` (``None`` when a finite source is exhausted by the caller's dedup)."""
    stubs, descriptions, passages = stdlib
    if source == "chat":
        return Prompt("", "pool", messages=({"role": "user", "content": _chat(rng)},))
    if source == "math":
        return Prompt("", "pool", messages=({"role": "user", "content": _math(rng)},))
    if source == "code-chat":
        task = rng.choice(CODE_TASKS) if rng.random() < 0.4 or not descriptions else rng.choice(descriptions)
        return Prompt("", "pool", messages=({"role": "user", "content": rng.choice(CODE_TEMPLATES).format(c=task)},))
    if source == "code":
        return Prompt("", "pool", prompt=rng.choice(stubs)) if stubs else None
    passage = rng.choice(passages) if passages else None
    if passage is None:
        return None
    how = rng.choice(("in two sentences", "in one paragraph", "in three bullet points", "for a beginner", "briefly"))
    return Prompt(
        "", "pool", messages=({"role": "user", "content": f"Summarize the following passage {how}.\n\n{passage}"},)
    )


def build_pool(n: int, seed: int = 0) -> list[Prompt]:
    """``n`` distinct prompts (ids ``pool/<source>/<k>``), sources mixed by ``MIX`` in a seeded order."""
    rng = random.Random(seed)
    stdlib = _stdlib()
    sources, weights = list(MIX), list(MIX.values())
    out: dict[str, Prompt] = {}
    misses = dict.fromkeys(MIX, 0)
    while len(out) < n:
        live = [i for i, s in enumerate(sources) if misses[s] < 200]
        if not live:
            raise ValueError(f"the pool sources yield only {len(out)} distinct prompts, {n} asked")
        source = sources[rng.choices(live, [weights[i] for i in live])[0]]
        p = _draw(source, rng, stdlib)
        key = p.prompt if p is not None and p.prompt is not None else (p.messages[0]["content"] if p else None)
        if key is None or key in out:
            misses[source] += 1
            continue
        misses[source] = 0
        out[key] = Prompt(f"pool/{source}/{len(out)}", "pool", prompt=p.prompt, messages=p.messages)
    return list(out.values())


def prompt_text(p: Prompt) -> str:
    """The text a prompt is keyed by (the raw prompt or its single user turn)."""
    return p.prompt if p.prompt is not None else p.messages[-1]["content"]
