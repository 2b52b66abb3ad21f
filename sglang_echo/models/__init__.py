"""Model artefacts for sglang-echo: the prepared SmolLM2 target, tiny test models, prompt sets."""
