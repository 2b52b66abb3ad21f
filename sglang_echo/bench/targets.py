"""The servers `echo-bench serve` measures: their names, URLs and the API each one speaks.

``--base-url`` names servers that are already running: ``URL`` (one server) or a comma list of
``NAME=URL`` (several, side by side; ``none`` is the one speedups and the lossless check are taken
against). :func:`probe` asks each one what it is before anything is measured:

* ``native``: an sglang server (``/model_info`` or the older ``/get_model_info`` answers). Requests
  go to its ``/generate``, whose ``meta_info`` carries verify steps (MAT) and output token ids
  (the lossless check);
* ``openai``: any other OpenAI-compatible server (``/v1/models`` answers). Requests go to
  ``/v1/completions``; its ``usage`` counts tokens, but nothing tells verify steps (MAT unknown),
  and the lossless check compares output text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

APIS = ("native", "openai")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
DEFAULT_NAME = "server"  # a lone bare URL's label


class TargetError(ValueError):
    """A ``--base-url`` that cannot be measured (one line, naming the server)."""


@dataclass(frozen=True)
class Target:
    """One server under test: its label in the results, its base URL (no trailing slash), the API it
    is asked through, and the model name OpenAI requests carry (None: native, which needs none)."""

    name: str
    url: str
    api: str = "native"
    model: str | None = None
    model_path: str | None = None  # what the server says it serves (native), for its config and tokenizer


def check_url(url: str, what: str) -> str:
    """``url`` without a trailing slash, if it is ``http(s)://host[:port][/path]`` (TargetError else)."""
    bad = TargetError(f"{what}: {url!r} is not http(s)://HOST[:PORT] (e.g. http://127.0.0.1:30000)")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number in 0-65535
    except ValueError:
        raise bad from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise bad
    return url.rstrip("/")


def parse_base_urls(text: str) -> list[tuple[str, str]]:
    """``--base-url``'s (name, URL) pairs: one bare URL (named ``server``), or ``NAME=URL,...`` with
    distinct names of letters, digits, ``.``, ``_`` and ``-``."""
    entries = [e.strip() for e in text.split(",")]
    pairs = []
    for entry in entries:
        name, sep, url = entry.partition("=")
        if not sep:
            if len(entries) > 1:
                raise TargetError(
                    f"--base-url {entry!r}: several servers need a name each, NAME=URL "
                    "(e.g. none=http://h:30000,echo=http://h:30001)"
                )
            name, url = DEFAULT_NAME, entry
        if not _NAME.match(name):
            raise TargetError(
                f"--base-url {entry!r}: the name before '=' labels the server's runs; use letters, "
                "digits, '.', '_' and '-'"
            )
        pairs.append((name, check_url(url, f"--base-url {name}" if sep else "--base-url")))
    names = [n for n, _ in pairs]
    if len(set(names)) != len(names):
        raise TargetError(f"--base-url: every server needs its own name, got {names}")
    return pairs


def _get_json(url: str, timeout: float) -> dict | None:
    """GET ``url``'s JSON object, or None (refused, not found, not JSON)."""
    import requests

    try:
        r = requests.get(url, timeout=timeout)
        data = r.json() if r.ok else None
    except (requests.RequestException, ValueError):
        return None
    return data if isinstance(data, dict) else None


def probe(name: str, url: str, model: str | None = None, timeout: float = 10.0) -> Target:
    """The :class:`Target` at ``url``: sglang's native API where its model info answers, else an
    OpenAI-compatible one (``model``, or the first model ``/v1/models`` lists), else TargetError."""
    for path in ("/model_info", "/get_model_info"):
        info = _get_json(url + path, timeout)
        if info is not None and "model_path" in info:
            return Target(name, url, "native", model, str(info["model_path"]))
    listing = _get_json(url + "/v1/models", timeout)
    if listing is not None:
        ids = [m.get("id") for m in listing.get("data") or [] if isinstance(m, dict) and m.get("id")]
        if model is None and not ids:
            raise TargetError(f"--base-url {name}={url}: /v1/models lists no model; pass --model NAME")
        return Target(name, url, "openai", model or ids[0])
    raise TargetError(f"--base-url {name}={url}: neither sglang's /model_info nor an OpenAI /v1/models answered")
