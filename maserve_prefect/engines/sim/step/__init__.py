"""The simulator's step loop: vLLM v1's scheduler step, live requests, fast-forward, records."""
