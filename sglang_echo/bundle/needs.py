"""What a bundle must carry: sglang's requirements on the CPU / bare-GPU path, and why others stay out.

sglang 0.5.23 declares its whole CUDA stack as hard requirements. The project installs it with
``--no-deps`` and pins the runtime the real-server test suite serves with in
``requirements-sglang.txt``; ``Needs`` applies the same rule to sglang's own Requires-Dist: a
requirement of sglang is followed only if that file (or ``--extra``) names the package, and every
other one is dropped with its reason. Dependencies of everything carried are followed in full.
torch, triton, transformers, torchvision and torchaudio are the host's, always: they are built
against its CUDA and never travel.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from sglang_echo.bundle import BundleError

SGLANG = "sglang"
SGLANG_VERSION = "0.5.23"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_RUNTIME = REPO_ROOT / "requirements-sglang.txt"

HOST_ONLY = frozenset({"torch", "triton", "transformers", "torchvision", "torchaudio"})

# sglang requirements that only its CUDA kernels path imports, with what stands in for them.
CUDA_ONLY = {
    "sglang-kernel": "sgl_kernel ops: sglang-echo's platform supplies them",
    "flashinfer-python": "FlashInfer attention/sampling kernels: sglang's other attention backends run without them",
    "flash-attn-4": "FlashAttention 4 kernels: an optional attention backend",
    "tilelang": "TileLang kernel compiler: only its kernels' backends use it",
    "nvidia-cutlass-dsl": "CUTLASS DSL kernels: only the CUTLASS backends use it",
    "nvidia-mathdx": "cuBLASDx/cuFFTDx headers for JIT kernels",
    "cuda-python": "a metapackage over cuda-bindings, which GPU hosts with torch have",
    "humming-kernels": "extra CUDA kernels for some quantised models",
    "quack-kernels": "CuTe-DSL kernels for some fused ops",
    "sgl-deep-ep": "DeepEP expert-parallel all-to-all (multi-GPU MoE)",
    "sgl-deep-gemm": "DeepGEMM FP8 GEMMs (FP8 models on Hopper)",
    "sgl-flash-mla": "FlashMLA (DeepSeek MLA attention)",
    "nvshmem4py-cu13": "NVSHMEM (multi-GPU communication)",
    "torch-memory-saver": "only with --enable-memory-saver",
}


def parse_requirements(path: Path, flag: str, pins_only: bool = False) -> list[Requirement]:
    """A requirements file: one requirement a line, ``#`` comments. ``pins_only`` (constraint
    files such as ``pip freeze`` output) skips option lines (``-e ...``) and URL requirements."""
    if not path.is_file():
        raise BundleError(f"{flag} {path}: no such file")
    out = []
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line or (pins_only and line.startswith("-")):
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement:
            raise BundleError(f"{flag} {path}:{lineno}: {line!r} is not a requirement") from None
        if req.url is None or not pins_only:
            out.append(req)
    return out


@dataclass(frozen=True)
class Needs:
    """The roots of the requirement graph and the rules for sglang's own requirements."""

    runtime: tuple[Requirement, ...]
    runtime_source: str
    extras: tuple[Requirement, ...] = ()
    constraints: dict[str, SpecifierSet] = field(default_factory=dict)

    def __post_init__(self):
        for req in self.extras:
            if canonicalize_name(req.name) in HOST_ONLY:
                raise BundleError(f"--extra {req}: {req.name} must come from the host, never from a bundle")

    def roots(self) -> list[tuple[Requirement, str]]:
        """(requirement, why) for sglang itself, the runtime file's packages and ``--extra``'s."""
        return [
            (Requirement(f"{SGLANG}=={SGLANG_VERSION}"), "the server (sglang-echo is an sglang plugin)"),
            *((r, f"{self.runtime_source}: {r}") for r in self.runtime),
            *((r, f"--extra {r}") for r in self.extras),
        ]

    def drop_reason(self, parent: str, req: Requirement) -> Optional[str]:
        """Why a requirement of ``parent`` is not followed (None: it is). Only sglang's are dropped, and
        never a HOST_ONLY one: those the host must have, and the manifest says whether it does."""
        if parent != SGLANG:
            return None
        name = canonicalize_name(req.name)
        if name in HOST_ONLY or name in {canonicalize_name(r.name) for r in (*self.runtime, *self.extras)}:
            return None
        generic = f"not in {self.runtime_source}, the runtime sglang's server is tested with: it does not import it"
        return CUDA_ONLY.get(name, generic)

    def constraint(self, name: str) -> SpecifierSet:
        return self.constraints.get(canonicalize_name(name), SpecifierSet())


def load_needs(runtime: Path, extras: list[str], constraint: Optional[Path]) -> Needs:
    """``Needs`` from the runtime file, ``--extra`` requirements and an optional constraint file."""
    try:
        extra_reqs = tuple(Requirement(e) for e in extras)
    except InvalidRequirement as e:
        raise BundleError(f"--extra: {e}") from None
    constraints: dict[str, SpecifierSet] = {}
    if constraint is not None:
        for req in parse_requirements(constraint, "--constraint", pins_only=True):
            name = canonicalize_name(req.name)
            constraints[name] = constraints.get(name, SpecifierSet()) & req.specifier
    return Needs(tuple(parse_requirements(runtime, "--runtime")), runtime.name, extra_reqs, constraints)


@dataclass(frozen=True)
class BuildNeeds:
    """The project's ``[build-system].requires``, for ``pip install -e .`` on the host with pip's
    build isolation and ``--no-index --find-links``: the editable install then builds with these
    wheels, whatever setuptools the host has (the project's metadata needs a recent one). An
    isolated build sees none of the host's packages, so these resolve against an empty host."""

    requires: tuple[Requirement, ...]
    source: str

    def roots(self) -> list[tuple[Requirement, str]]:
        return [(r, f"{self.source} [build-system] requires: {r}") for r in self.requires]

    def drop_reason(self, parent: str, req: Requirement) -> Optional[str]:
        return None

    def constraint(self, name: str) -> SpecifierSet:
        return SpecifierSet()


def load_build_needs(project: Path) -> BuildNeeds:
    path = project / "pyproject.toml"
    try:
        requires = tomllib.loads(path.read_text())["build-system"]["requires"]
        return BuildNeeds(tuple(Requirement(r) for r in requires), "pyproject.toml")
    except FileNotFoundError:
        raise BundleError(f"--project {project}: no pyproject.toml there") from None
    except (tomllib.TOMLDecodeError, KeyError, TypeError, InvalidRequirement) as e:
        raise BundleError(f"--project {path}: no valid [build-system] requires ({e})") from None
