"""The heterogeneous-GPU pool suite: recorded multi-agent work, every pool plan, the paper's goals.

One idea: the *work* is fixed per run seed — native simulator traces of the suite's workflows
(`pool.recorded`), recorded once and cached — and every arm (a pool plan, its cost
predictor, its ablation switches) runs that same work with the same arrivals on the same pool
(`pool.executor.run_pool`); only lifecycle and placement decisions differ. The suite then
reports, per arrival pattern, what was achieved next to the goals (`bench.pool.tables`).

The suite file (`kind: pool`) is parsed by `bench.pool.suite_file`.

As the paper's evaluation (§4.1): the work is recorded once per workflow (trace seed 42) and
replayed by every run; run `r` (0-based) orders the sessions and draws each scenario's Poisson
arrivals with seed `42 + r` (`pool.recorded.build_root_dags`); tables show the mean over runs,
and a ratio is the ratio of those means. Results are deterministic: the same suite file and
scale give identical tables.

Examples:
    >>> path_label(("Qwen3-0.6B", "Qwen3-8B"))
    '0.6B+8B'
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from maserve_prefect.bench.pool.results import ArmRun, OracleRun, PoolSuiteResult, Row
from maserve_prefect.bench.pool.suite_file import PoolSuite, Scale
from maserve_prefect.bench.pool.traces import record_traces
from maserve_prefect.bench.report import ProgressFn
from maserve_prefect.pool.costs import cost_model_source
from maserve_prefect.pool.executor import run_pool
from maserve_prefect.pool.lower_bound import lower_bound
from maserve_prefect.pool.oracle import fits_oracle, oracle
from maserve_prefect.pool.recorded import (
    ARRIVAL_SEED,
    POOL_MODELS,
    RootWork,
    build_root_dags,
    recorded_roots,
)
from maserve_prefect.pool.state import CostModel


def path_label(models: Sequence[str]) -> str:
    """A model path's short name: sizes joined by '+'."""
    return "+".join(m.removeprefix("Qwen3-") for m in models)


def cost_tables(
    suite: PoolSuite, arms: Sequence[str], roots: Sequence[RootWork], rows: Any,
    scale: Scale, num_trees: int,
) -> dict[str, CostModel]:  # fmt: skip
    """One cost table per predictor the `arms` use, over every request of `roots` (buckets up
    to the largest), the suite's models and the scale's devices, fitted on `rows`."""
    units = [u for r in roots for u in r.units]
    models = sorted({u.deployment for u in units} | set(POOL_MODELS))
    kinds = sorted({suite.arms[a].predictor for a in arms})
    source = cost_model_source()
    return {
        k: source.suite_cost_model(
            k,
            models=models,
            devices=scale.device_names(),
            max_input_len=max(u.input_len for u in units),
            max_output_len=max(u.max_tokens for u in units),
            steps_per_doubling=scale.bucket_steps,
            training=rows,
            num_trees=num_trees,
        )
        for k in kinds
    }


def run_pool_suite(
    suite: PoolSuite, scale: str = "demo", *, progress: ProgressFn | None = None
) -> PoolSuiteResult:
    """Run every (arrival pattern, run, arm) of `suite` at `scale`.

    Recording native traces needs a Prefect API (`prefect_server.ensure_server()` or a test
    harness) unless they are cached under `$MASERVE_HOME/pool_traces/`.

    Raises:
        ConfigError: unknown scale, names or profiles.
        SimulationError: a plan broke a rule or left work unfinished.
    """
    sc = suite.scale(scale)
    patterns = list(sc.arrivals or suite.arrivals)
    arms = list(sc.arms or suite.arms)
    devices = sc.device_names()
    sizing = suite.sizing(sc)
    out = PoolSuiteResult(suite, scale)
    t0 = time.perf_counter()
    spec = suite.training_spec(sc)
    source = cost_model_source()
    rows = source.training_rows(spec)
    if sc.score_predictors:
        out.predictors = source.training_scores(rows, spec.num_trees)
    out.seconds["predictors"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    traces = record_traces(suite.workflows, sc.sessions_per_workflow, ARRIVAL_SEED)
    recorded = recorded_roots(traces)  # one trace per workflow, replayed by every run
    out.seconds["record"] = time.perf_counter() - t1
    by_run = [recorded] * sc.runs
    for run in range(sc.runs):
        out.paths[run] = {r.root_id: path_label(r.models) for r in recorded}
        out.workload += _workload_rows(run, recorded)
    t2 = time.perf_counter()
    every = recorded  # buckets must cover every request
    costs = cost_tables(suite, arms, every, rows, sc, spec.num_trees)
    out.seconds["cost_tables"] = time.perf_counter() - t2
    total, done = sc.runs * len(patterns) * len(arms), 0
    for run, roots in enumerate(by_run):
        for pname in patterns:
            workflows = build_root_dags(roots, suite.arrivals[pname].pattern(), run)
            out.lower_bounds[(pname, run)] = lower_bound(
                workflows, devices, options=sizing.options()
            ).bound_s
            seeds = {}
            for arm in arms:
                a = suite.arms[arm]
                t3 = time.perf_counter()
                res = run_pool(
                    workflows,
                    devices,
                    a.plan,
                    costs=costs[a.predictor],
                    options=a.options(sizing),
                )
                key = f"{pname}/{arm}/run{run}"
                out.seconds[key] = time.perf_counter() - t3
                out.runs.append(ArmRun.of(pname, arm, run, res))
                seeds[arm] = res  # every arm's run is a schedule of the same deployments
                done += 1
                if progress is not None:
                    progress(done, total, key)
            num_units = sum(len(w.units) for w in workflows)
            if sc.oracle_evaluations and seeds and fits_oracle(num_units, len(devices)):
                t4 = time.perf_counter()
                found = oracle(
                    workflows,
                    devices,
                    seeds=seeds,
                    options=sizing.options(),
                    max_evaluations=sc.oracle_evaluations,
                )
                out.oracles[(pname, run)] = OracleRun.of(found)
                out.seconds[f"{pname}/oracle/run{run}"] = time.perf_counter() - t4
            else:
                out.oracle_skipped[(pname, run)] = (
                    "off at this scale (oracle_evaluations: 0)"
                    if not sc.oracle_evaluations
                    else f"{num_units} calls on {len(devices)} devices: beyond the Oracle's "
                    "size limits (pool.oracle.fits_oracle)"
                )
    out.seconds["total"] = time.perf_counter() - t0
    return out


def _workload_rows(run: int, roots: Sequence[RootWork]) -> list[Row]:
    rows = []
    for wf in dict.fromkeys(r.workflow for r in roots):
        mine = [r for r in roots if r.workflow == wf]
        rows.append(
            {
                "run": run,
                "workflow": wf,
                "sessions": len(mine),
                "model_calls": sum(len(r.units) for r in mine),
                "folded_ops": sum(r.num_folded_ops for r in mine),
                "folded_tool_s_per_session": sum(r.folded_delay_s for r in mine) / len(mine),
            }
        )
    return rows
