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

from maserve_prefect.bench.fanout import Fanout, run_units
from maserve_prefect.bench.pool.results import ArmRun, OracleRun, PoolSuiteResult, Row
from maserve_prefect.bench.pool.suite_file import PoolSuite, Scale
from maserve_prefect.bench.pool.traces import record_traces
from maserve_prefect.bench.report import ProgressFn
from maserve_prefect.bench.units import Unit
from maserve_prefect.pool.costs import cost_model_source
from maserve_prefect.pool.executor import run_pool
from maserve_prefect.pool.inputs import ExecOptions, RootDag
from maserve_prefect.pool.lower_bound import lower_bound
from maserve_prefect.pool.oracle import fits_oracle, oracle
from maserve_prefect.pool.recorded import (
    ARRIVAL_SEED,
    POOL_MODELS,
    RootWork,
    build_root_dags,
    recorded_roots,
)
from maserve_prefect.pool.results import PoolRunResult
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


def arm_unit(
    workflows: Sequence[RootDag], devices: Sequence[str], plan: str, costs: CostModel,
    options: ExecOptions,
) -> PoolRunResult:  # fmt: skip
    """One (pattern, run, arm) of a pool suite: its plan on a fresh pool (a `bench.fanout`
    unit)."""
    return run_pool(workflows, devices, plan, costs=costs, options=options)


def oracle_unit(
    workflows: Sequence[RootDag], devices: Sequence[str], seeds: dict[str, PoolRunResult],
    options: ExecOptions, max_evaluations: int,
) -> OracleRun:  # fmt: skip
    """The Oracle of one (pattern, run), seeded with every arm's schedule (a `bench.fanout`
    unit)."""
    found = oracle(
        workflows, devices, seeds=seeds, options=options, max_evaluations=max_evaluations
    )
    return OracleRun.of(found)


def run_pool_suite(
    suite: PoolSuite,
    scale: str = "demo",
    *,
    progress: ProgressFn | None = None,
    fanout: Fanout | None = None,
) -> PoolSuiteResult:
    """Run every (arrival pattern, run, arm) of `suite` at `scale`.

    The work is recorded, the predictors trained and the cost tables built here; then every
    (pattern, run, arm) is one unit (`bench.fanout`: here in order, or on Dask), and after them
    every (pattern, run)'s Oracle, seeded with that cell's arm runs. `seconds` holds each unit's
    own wall time.

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
    cells = []  # (pattern, run, workflows): every arm of a cell runs the same work
    for run, roots in enumerate(by_run):
        for pname in patterns:
            workflows = build_root_dags(roots, suite.arrivals[pname].pattern(), run)
            out.lower_bounds[(pname, run)] = lower_bound(
                workflows, devices, options=sizing.options()
            ).bound_s
            cells.append((pname, run, workflows))
    units = [
        Unit(f"{pname}/{arm}/run{run}", arm_unit,
             (workflows, devices, suite.arms[arm].plan, costs[suite.arms[arm].predictor],
              suite.arms[arm].options(sizing)))
        for pname, run, workflows in cells
        for arm in arms
    ]  # fmt: skip
    results, unit_runs = run_units(units, fanout, progress)
    found = iter(zip(results, unit_runs, strict=True))
    oracle_units, oracle_cells = [], []
    for pname, run, workflows in cells:
        seeds = {}
        for arm in arms:
            res, unit_run = next(found)
            out.seconds[unit_run.label] = unit_run.seconds
            out.runs.append(ArmRun.of(pname, arm, run, res))
            seeds[arm] = res  # every arm's run is a schedule of the same deployments
        num_units = sum(len(w.units) for w in workflows)
        if sc.oracle_evaluations and seeds and fits_oracle(num_units, len(devices)):
            oracle_units.append(
                Unit(f"{pname}/oracle/run{run}", oracle_unit,
                     (workflows, devices, seeds, sizing.options(), sc.oracle_evaluations))
            )  # fmt: skip
            oracle_cells.append((pname, run))
        else:
            out.oracle_skipped[(pname, run)] = (
                "off at this scale (oracle_evaluations: 0)"
                if not sc.oracle_evaluations
                else f"{num_units} calls on {len(devices)} devices: beyond the Oracle's "
                "size limits (pool.oracle.fits_oracle)"
            )
    oracles, oracle_runs = run_units(oracle_units, fanout)
    for cell, orc, unit_run in zip(oracle_cells, oracles, oracle_runs, strict=True):
        out.oracles[cell] = orc
        out.seconds[unit_run.label] = unit_run.seconds
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
