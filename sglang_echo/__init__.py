"""sglang-echo: ECHO elastic speculative decoding for SGLang."""

__version__ = "0.1.0"
