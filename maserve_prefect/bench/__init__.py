"""Benchmark suites of three kinds (replay, pool, HEAR) behind one schema, loader and runner.

`suite_base` (the header every suite file has) and `suite` (the one loader, picking the kind's
model: `replay.suite_file`, `pool.suite_file`, `hear.suite_file`); `runner` (run any kind at a
scale) returning `result.SuiteResult` built from a kind-neutral `report.Report`; `flow` (the
`maserve-suite` Prefect flow and `run_suite`); `serve` (scheduled suites as deployments).
"""
