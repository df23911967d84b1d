"""The simulator's engine step: vLLM v1's scheduler step, fast-forwarded runs, modes, records."""
