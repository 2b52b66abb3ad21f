"""Launching and managing a real sglang server (CPU platform or GPU)."""
