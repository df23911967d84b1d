"""The simulated KV cache, layer by layer as in vLLM v1: block pool, prefix cache, manager, tiers."""
