"""maserve-prefect: multi-agent LLM collaboration as measurable serving workloads on Prefect.

Subpackages: `spec` (workload model), `trace` (Semantic Trace ledger and store), `engine`
(engine protocol, simulator, real backends), `runtime` (dispatcher), `replay`, `metrics`, `hear`,
and the user-facing folders shipped as `flows`, `tasks`, `predictors`, `bindings`.
"""

__version__ = "0.1.0"
