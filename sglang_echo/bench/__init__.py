"""Benchmarks (`echo-bench`): every figure is measured in the run that prints it."""
