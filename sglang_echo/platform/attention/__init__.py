"""Pure-torch paged attention backend for sglang (extend, decode, target verify, EAGLE drafts)."""

BACKEND_NAME = "echo_torch"
