"""Drafter training (`echo-train-drafter`): self-distillation data, feature capture, objectives."""
