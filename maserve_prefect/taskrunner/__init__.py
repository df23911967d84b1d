"""`MAServeTaskRunner` and what it needs to see the op graph of a Prefect flow.

`runner` is the Prefect task runner; `harness` is what one native run shares (clock regime,
dispatcher, ledger, op numbering); `lockstep` / `wallgate` are the two clock regimes; `opgraph`,
`opfutures`, `oprun` and `opsubmit` are the runner's op graph, futures, op records and
submission; `memory_store` is the agents' versioned shared state.
"""
