"""``echo-bundle``: sglang 0.5.23's runtime as wheels for a GPU host without network.

The bundle holds every third-party wheel that sglang and sglang-echo need at runtime beyond what
the host already has (never torch, triton or transformers), the sglang wheel itself slimmed of
what the server does not import, a manifest, and ``install.py`` for the host. sglang-echo itself is
not in it: the repository travels to the host and is installed there with ``pip install --no-deps
-e .``. See ``sglang_echo/bundle/README.md``.
"""


class BundleError(Exception):
    """A problem the user can fix (a bad flag, a missing wheel): its message names the flag or
    package, and is one line (a multi-line cause, such as a requirement parser's caret display, is
    folded), so the CLI prints it without a traceback."""

    def __init__(self, message: str):
        super().__init__(" ".join(line.strip() for line in message.splitlines() if line.strip()))
