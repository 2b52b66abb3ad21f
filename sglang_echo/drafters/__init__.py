"""Drafters: the interface (base.py) and the engine-agnostic drafters."""
