"""The embedded simulator of vLLM-v1 serving on simulated GPUs.

`replica.SimReplica` is the `protocol` Replica over its step loop (`loop`), which composes the
parts below; `request` is a request's live state inside the simulator. `step/` holds the
scheduler step function, fast-forwarded runs, execution modes and step records; `kv/` the paged
KV cache with prefix caching, its block pool, hash index, host tier and retention pins; `cost/`
the roofline step-time model and its calibration against measured profiles; `pool/` the
`SimPool` of devices and replicas with lifecycle on the clock; `hear/` the engine side of HEAR
(control resolution, cache controls, state reports).
"""
