"""maserve-prefect: multi-agent LLM collaboration as measurable serving workloads on Prefect.

Packages, lowest layer first (each imports only those below it; `make lint` checks it):
`clock` (time), `protocol` (the engine seam and HEAR's vocabulary), `engines` (catalog,
simulator, OpenAI-compatible client, vLLM processes), `trace` (Semantic Trace ledger and store),
`spec` (workload model), `workloads` (sessions, arrivals), `metrics`, `dispatch` (the one
dispatcher and its plans), `pool` (heterogeneous-pool runtime), `hear` (HEAR policies),
`taskrunner` (the Prefect task runner), `replay`, `bench`, `cli`. The user folders ship as
`flows`, `tasks`, `predictors`, `bindings` and are reached through `plugins`.
"""

__version__ = "0.1.0"
