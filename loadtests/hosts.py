"""Which servers a load test may target: loopback, unless remote targets are explicitly allowed.

A load test at 256 users is a denial of service for a shared server, so a mistyped or pasted
production URL must not be enough to start one.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


class RemoteHostRefused(ValueError):
    pass


def is_loopback(url: str) -> bool:
    """True for http(s) URLs whose host is ``localhost`` or a loopback IP literal.

    Deliberately no DNS lookup: a name is judged by what it says, not by what a resolver
    answers today.
    """
    host = urlsplit(url).hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_host(url: str, *, allow_remote: bool) -> str:
    """Return ``url`` without a trailing slash, or raise if it is not a target we may load."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteHostRefused(f"{url!r} is not an http(s) URL with a host")
    if not allow_remote and not is_loopback(url):
        raise RemoteHostRefused(
            f"refusing to load {parts.hostname}: only localhost is targeted by default; "
            "pass --allow-remote to load a server you are responsible for"
        )
    return url.rstrip("/")
