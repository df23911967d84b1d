"""Engines: everything that serves a `protocol` request.

`catalog/` (model and GPU facts, lifecycle timings) is read by the simulator and the predictors;
`sim/` is the embedded vLLM-v1 simulator (the default engine); `openai/` is the client of any
OpenAI-compatible server; `vllm/` starts and pools real vLLM server processes. `poolfile` reads
the pool files that say which devices and deployments a run has; `target` names which engine a
run addresses. Engines never import dispatch, pool, replay, HEAR policies or the user folders.
"""
