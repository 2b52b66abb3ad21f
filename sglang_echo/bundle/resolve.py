"""The closure of what a bundle carries, resolved in rounds to a fixpoint.

Each round walks the requirement graph from ``Graph.roots`` through the wheels picked so far
(their METADATA's Requires-Dist, markers evaluated for the target), merges every specifier put on
each package, and fetches the packages not yet picked or whose pick no longer satisfies the merged
specifier; a later round sees the new picks' dependencies. On return (``Resolution``):

* every carried package's version satisfies every specifier that a root, a carried package or a
  constraint puts on it;
* every dependency that applies on the host is carried, or the host's (``HostUse``: with whether
  its known version satisfies), or, if the host lacks it, dropped by ``Graph.drop_reason``
  (``Dropped``: with why);
* nothing the host has, and nothing in ``HOST_ONLY``, is carried.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion

from sglang_echo.bundle import BundleError
from sglang_echo.bundle.host import HostPackages
from sglang_echo.bundle.needs import HOST_ONLY
from sglang_echo.bundle.target import Target
from sglang_echo.bundle.wheels import WheelInfo, read_wheel

Fetch = Callable[[dict[str, SpecifierSet]], dict]
MAX_ROUNDS = 12


class Graph(Protocol):
    """What to resolve: ``needs.Needs`` (the runtime) or ``needs.BuildNeeds`` (the build backend)."""

    def roots(self) -> list[tuple[Requirement, str]]: ...

    def drop_reason(self, parent: str, req: Requirement) -> Optional[str]: ...

    def constraint(self, name: str) -> SpecifierSet: ...


@dataclass
class Want:
    """Everything asked of one package: merged specifier, extras, and who asked (in order)."""

    name: str
    specifier: SpecifierSet = field(default_factory=SpecifierSet)
    extras: set[str] = field(default_factory=set)
    why: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class HostUse:
    """A needed package that the bundle leaves to the host."""

    name: str
    specifier: str
    version: Optional[str]
    on_host: bool
    why: tuple[str, ...]

    @property
    def status(self) -> str:
        """``missing``, ``unknown`` (no version in the host file), ``ok`` or ``mismatch``."""
        if not self.on_host:
            return "missing"
        if self.version is None:
            return "unknown"
        try:
            return "ok" if SpecifierSet(self.specifier).contains(self.version, prereleases=True) else "mismatch"
        except InvalidVersion:
            return "unknown"


@dataclass(frozen=True)
class Dropped:
    name: str
    requirement: str
    why: str


@dataclass(frozen=True)
class Resolution:
    carried: tuple[tuple[WheelInfo, Want], ...]
    host: tuple[HostUse, ...]
    dropped: tuple[Dropped, ...]


def _carried(name: str, host: HostPackages) -> bool:
    return name not in HOST_ONLY and not host.has(name)


def _walk(
    needs: Graph, host: HostPackages, target: Target, picked: dict[str, WheelInfo]
) -> tuple[dict[str, Want], dict[str, Dropped]]:
    wants: dict[str, Want] = {}
    dropped: dict[str, Dropped] = {}
    expanded: dict[str, frozenset[str]] = {}
    queue: deque[str] = deque()

    def add(req: Requirement, why: str) -> None:
        want = wants.setdefault(canonicalize_name(req.name), Want(canonicalize_name(req.name)))
        want.specifier &= req.specifier
        want.extras |= set(req.extras)
        if why not in want.why:
            want.why.append(why)
        queue.append(want.name)

    for req, why in needs.roots():
        if target.applies(req):
            add(req, why)
    while queue:
        want = wants[queue.popleft()]
        extras = frozenset(want.extras)
        if want.name not in picked or not _carried(want.name, host) or expanded.get(want.name) == extras:
            continue
        expanded[want.name] = extras
        wheel = picked[want.name]
        for req in wheel.requires:
            if not target.applies(req, extras):
                continue
            who = f"{wheel.name} {wheel.version}: {req}"
            # What the host has is recorded as such, dropped or not: "dropped" lists only what it lacks.
            on_host = not _carried(canonicalize_name(req.name), host)
            reason = None if on_host else needs.drop_reason(wheel.name, req)
            if reason is not None:
                dropped[who] = Dropped(canonicalize_name(req.name), who, reason)
            else:
                add(req, who)
    # A package sglang's own requirement would drop can still come in through another one (distro via openai).
    return wants, {who: d for who, d in dropped.items() if d.name not in wants}


def resolve(needs: Graph, host: HostPackages, target: Target, fetch: Fetch) -> Resolution:
    """Fetch rounds until every carried package's pick satisfies its merged specifier."""
    picked: dict[str, WheelInfo] = {}
    for _ in range(MAX_ROUNDS):
        wants, dropped = _walk(needs, host, target, picked)
        specs = {n: w.specifier & needs.constraint(n) for n, w in wants.items() if _carried(n, host)}
        stale = {
            n: s for n, s in specs.items() if n not in picked or not s.contains(picked[n].version, prereleases=True)
        }
        if not stale:
            carried = tuple((picked[n], wants[n]) for n in sorted(specs))
            kept = tuple(
                HostUse(n, str(w.specifier), host.version(n), host.has(n), tuple(w.why))
                for n, w in sorted(wants.items())
                if n not in specs
            )
            return Resolution(carried, kept, tuple(dropped.values()))
        try:
            fetched = fetch(stale)
        except BundleError as e:
            asked = [
                f"{n}{s} (wanted by {'; '.join(wants[n].why)})"
                for n, s in sorted(stale.items())
                if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", str(e), re.IGNORECASE)
            ]
            raise BundleError(f"{e}{' -- ' + ', '.join(asked) if asked else ''}") from None
        for name, path in fetched.items():
            picked[name] = read_wheel(path)
    raise BundleError(f"no consistent set of wheels after {MAX_ROUNDS} rounds; still changing: {sorted(stale)}")
