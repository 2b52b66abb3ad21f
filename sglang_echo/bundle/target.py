"""The host a bundle is built for: its Python version and wheel platform tags.

``Target`` answers the two questions the resolver asks about the host without being on it: which
wheels pip may pick for it (``pip_args``) and whether a dependency's environment marker holds there
(``applies``, PEP 508 markers evaluated for that Python on Linux).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.requirements import Requirement

from sglang_echo.bundle import BundleError

_PYTHON = re.compile(r"^3\.(\d{1,2})(\.\d{1,2})?$")
_MACHINES = "x86_64|aarch64|i686|ppc64le|s390x|armv7l"
_PLATFORM = re.compile(rf"^(manylinux_2_(\d+)|manylinux(?:1|2010|2014)|musllinux_1_\d+|linux)_({_MACHINES})$")
# The legacy manylinux names and the glibc they stand for (PEP 600).
_LEGACY = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}


def _expand(tag: str) -> list[str]:
    """``manylinux_2_N_arch`` means "glibc 2.N": every manylinux tag such a host accepts, newest
    first (pip matches ``--platform`` tags exactly, so a wheel tagged 2_28 needs 2_28 listed)."""
    m = _PLATFORM.match(tag)
    if m is None or m.group(2) is None:
        return [tag]
    glibc, machine = int(m.group(2)), m.group(3)
    tags = [f"manylinux_2_{n}_{machine}" for n in range(glibc, 4, -1)]
    tags += [f"{legacy}_{machine}" for legacy, n in _LEGACY.items() if n <= glibc]
    return tags


@dataclass(frozen=True)
class Target:
    """A CPython version (``3.12`` or ``3.12.3``) and the host's wheel platform tags, as given."""

    python: str
    platforms: tuple[str, ...]

    @classmethod
    def parse(cls, python: str, platforms: list[str]) -> "Target":
        if not _PYTHON.match(python):
            raise BundleError(f"--python {python!r}: give a CPython 3 version such as 3.12")
        if not platforms:
            raise BundleError("--platform: give at least one tag such as manylinux_2_39_x86_64")
        for tag in platforms:
            if not _PLATFORM.match(tag):
                raise BundleError(f"--platform {tag!r}: not a Linux wheel platform tag such as manylinux_2_39_x86_64")
        machines = {_PLATFORM.match(t).group(3) for t in platforms}
        if len(machines) != 1:
            raise BundleError(f"--platform: the tags name several machines {sorted(machines)}; a host has one")
        return cls(python, tuple(platforms))

    @property
    def machine(self) -> str:
        return _PLATFORM.match(self.platforms[0]).group(3)

    @property
    def python_minor(self) -> str:
        """``3.12`` for ``3.12.3``."""
        return ".".join(self.python.split(".")[:2])

    @property
    def abi(self) -> str:
        return "cp" + self.python_minor.replace(".", "")

    def pip_args(self) -> list[str]:
        """``pip download`` flags that select this host's binary wheels (never an sdist)."""
        tags = list(dict.fromkeys(t for p in self.platforms for t in _expand(p)))
        return [
            "--only-binary=:all:",
            "--python-version",
            self.python_minor,
            "--implementation",
            "cp",
            *(a for t in tags for a in ("--platform", t)),
        ]

    def marker_env(self, extra: str = "") -> dict[str, str]:
        full = self.python if self.python.count(".") == 2 else self.python + ".0"
        return {
            "python_version": self.python_minor,
            "python_full_version": full,
            "implementation_version": full,
            "implementation_name": "cpython",
            "platform_python_implementation": "CPython",
            "os_name": "posix",
            "sys_platform": "linux",
            "platform_system": "Linux",
            "platform_machine": self.machine,
            "platform_release": "",
            "platform_version": "",
            "extra": extra,
        }

    def applies(self, req: Requirement, extras: frozenset[str] = frozenset()) -> bool:
        """Whether ``req`` (a dependency of a package installed with ``extras``) holds on the host."""
        if req.marker is None:
            return True
        return any(req.marker.evaluate(self.marker_env(e)) for e in ("", *sorted(extras)))
