"""The embedded simulator of vLLM-v1 serving on simulated GPUs.

`replica.SimReplica` is the `protocol` Replica over a step loop; inside it `step/` holds the
scheduler step function, requests, fast-forwarded runs and step records; `kv/` the paged KV cache
with prefix caching, its block pool, hash index, host tier and retention pins; `cost/` the
roofline step-time model and its calibration against measured profiles; `pool/` the `SimPool`
of devices and replicas with lifecycle on the clock; `hear/` the engine side of HEAR (control
resolution, cache controls, state reports).
"""
