"""Find what sglang's source imports from `sgl_kernel` on the CUDA path, by reading it (AST).

For one module file, :func:`collect` lists every `from sgl_kernel[.x] import name`,
`import sgl_kernel[.x]` and `sgl_kernel.name` attribute use that can run on a CUDA host:
`if` branches are followed by evaluating their conditions against the facts of such a host
(:data:`CUDA_HOST_FACTS`: `_is_cuda` / `is_cuda()` true; HIP, NPU, XPU, MUSA, the CPU engine,
aiter, AMX, FlashInfer false); a condition on anything else keeps both branches. Each hit records
whether it sits in a function body (runs when called, not at import) and whether a
`try: ... except ImportError` (or a broader handler) guards it, i.e. sglang has its own
fallback when the name is missing.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

# Identifier (leading underscores stripped) -> its value on a CUDA host without FlashInfer.
CUDA_HOST_FACTS: dict[str, bool] = {
    "is_cuda": True,
    "is_cuda_alike": True,
    "is_cuda_available": True,
    "is_hip": False,
    "is_rocm_available": False,
    "use_aiter": False,
    "is_npu": False,
    "is_npu_available": False,
    "is_xpu": False,
    "is_xpu_available": False,
    "is_musa": False,
    "is_musa_available": False,
    "is_mps": False,
    "is_mps_available": False,
    "is_cpu": False,
    "is_cpu_available": False,
    "is_hpu": False,
    "is_sail": False,
    "is_cpu_amx_available": False,
    "cpu_has_amx_support": False,
    "is_flashinfer_available": False,
    "TYPE_CHECKING": False,
}
_GUARD_EXCEPTIONS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


@dataclass(frozen=True)
class KernelImport:
    module: str  # the sglang module that imports
    line: int
    source: str  # "sgl_kernel" or "sgl_kernel.<sub>"
    name: Optional[str]  # the imported name; None for the module itself
    in_function: bool
    guarded: bool


def _fact(node: ast.expr) -> Optional[bool]:
    if isinstance(node, ast.Call) and not node.args and not node.keywords:
        node = node.func
    ident = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return None if ident is None else CUDA_HOST_FACTS.get(ident.lstrip("_"))


def evaluate(test: ast.expr) -> Optional[bool]:
    """The condition's value on a CUDA host (three-valued: None when it depends on anything else)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        value = evaluate(test.operand)
        return None if value is None else not value
    if isinstance(test, ast.BoolOp):
        values = [evaluate(v) for v in test.values]
        decisive = isinstance(test.op, ast.Or)  # Or: any True decides; And: any False decides
        if decisive in values:
            return decisive
        return None if None in values else not decisive
    return _fact(test)


def _guards(handlers: list[ast.ExceptHandler]) -> bool:
    for h in handlers:
        kinds = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
        for kind in kinds:
            if kind is None or (isinstance(kind, ast.Name) and kind.id in _GUARD_EXCEPTIONS):
                return True
    return False


def _is_kernel(name: Optional[str]) -> bool:
    return name is not None and (name == "sgl_kernel" or name.startswith("sgl_kernel."))


class _Collector:
    def __init__(self, module: str) -> None:
        self.module = module
        self.found: list[KernelImport] = []

    def _hit(self, node: ast.AST, source: str, name: Optional[str], in_function: bool, guarded: bool) -> None:
        self.found.append(KernelImport(self.module, node.lineno, source, name, in_function, guarded))

    def visit(self, node: ast.AST, in_function: bool, guarded: bool) -> None:
        if isinstance(node, ast.If):
            self.visit(node.test, in_function, guarded)
            value = evaluate(node.test)
            branches = [node.body] if value is True else [node.orelse] if value is False else [node.body, node.orelse]
            for stmt in (s for branch in branches for s in branch):
                self.visit(stmt, in_function, guarded)
            return
        if isinstance(node, ast.Try):
            for stmt in node.body:
                self.visit(stmt, in_function, guarded or _guards(node.handlers))
            for stmt in [*node.handlers, *node.orelse, *node.finalbody]:
                self.visit(stmt, in_function, guarded)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_function = True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and _is_kernel(node.module):
            for alias in node.names:
                self._hit(node, node.module, alias.name, in_function, guarded)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _is_kernel(alias.name):
                    self._hit(node, alias.name, None, in_function, guarded)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "sgl_kernel":
            self._hit(node, "sgl_kernel", node.attr, in_function, guarded)
        for child in ast.iter_child_nodes(node):
            self.visit(child, in_function, guarded)


def collect(path: Path, module: str) -> list[KernelImport]:
    """Every `sgl_kernel` use in one file that can run on a CUDA host (see the module docstring)."""
    collector = _Collector(module)
    collector.visit(ast.parse(path.read_text(), str(path)), in_function=False, guarded=False)
    return collector.found


def module_files(modules: list[str], root: Path) -> Iterator[tuple[str, Path]]:
    """(module, source file) for each module found under ``root`` (site-packages)."""
    for module in modules:
        base = root.joinpath(*module.split("."))
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                yield module, path
                break
