"""The one suite runner: run a parsed suite of any kind at a scale, in the current context.

One idea: `execute_suite` is the single entry for every kind — it checks the scale, opens a
Prefect progress artifact (`maserve-suite-<name>-progress`, a no-op outside a flow run),
dispatches to the kind's own loop (`bench.replay.suite.run_replay_suite`,
`bench.pool.suite.run_pool_suite`, or one of the HEAR experiments in `bench.hear`) with a
progress callback that advances the artifact and the caller's bar after each unit of work, and
wraps what the kind returns in the one result type (`bench.result.SuiteResult`). Each kind's
independent units (replay arm runs, pool (pattern, run, arm) runs, HEAR arms) go through one
fan-out seam (`bench.fanout`): here in order by default, on Dask with `workers > 1` or a
`dask_address`, one cluster per suite run; a fanned-out result adds the `units` table (where
each unit ran, the retried ones) and a header line. It starts no
flow of its own: the `maserve-suite` flow (`bench.flow`) is a thin wrapper that calls it, so the
flow depends on the runner and never the other way round.

Examples:
    >>> from maserve_prefect.bench.suite import parse_suite
    >>> execute_suite(parse_suite({"name": "s", "scenarios": ["a.yaml"]}), "huge", prefect=False)
    Traceback (most recent call last):
    ...
    maserve_prefect.errors.ConfigError: suite s: unknown scale 'huge'; use one of demo, full
"""

from __future__ import annotations

from pathlib import Path

from maserve_prefect.bench.fanout import Fanout
from maserve_prefect.bench.hear.calibrate import run_calibration
from maserve_prefect.bench.hear.mooncake_suite import run_mooncake
from maserve_prefect.bench.hear.role_modes import run_role_modes
from maserve_prefect.bench.hear.scbench_suite import run_scbench
from maserve_prefect.bench.hear.suite_file import MooncakeSuite, ScbenchSuite
from maserve_prefect.bench.pool.suite import run_pool_suite
from maserve_prefect.bench.pool.suite_file import PoolSuite
from maserve_prefect.bench.pool.tables import pool_report
from maserve_prefect.bench.replay.suite import run_replay_suite
from maserve_prefect.bench.replay.suite_file import ReplaySuite
from maserve_prefect.bench.report import ProgressFn, Table
from maserve_prefect.bench.result import SuiteResult
from maserve_prefect.bench.suite import Suite
from maserve_prefect.errors import ConfigError
from maserve_prefect.metrics.report import Progress


def execute_suite(
    suite: Suite,
    scale: str = "demo",
    *,
    prefect: bool = True,
    progress: ProgressFn | None = None,
    out: Path | None = None,
    trace: Path | None = None,
    calibrate: bool = False,
    workers: int = 1,
    dask_address: str | None = None,
) -> SuiteResult:
    """Run `suite` at `scale` and return its result (no flow run of its own).

    Args:
        suite: a parsed suite of any kind (`bench.suite.load_suite`).
        scale: one of the suite's scales (`suite.scale_names()`).
        prefect: replay suites run each arm as a `maserve-replay-arm` flow run (False: bare).
            Other kinds ignore it (a pool suite records its native traces through Prefect
            either way, unless they are cached).
        progress: called after each unit of work (`bench.report.ProgressFn`).
        out: where a run writes its side files (HEAR workloads, the frozen role -> mode
            mapping); the results themselves are written by `SuiteResult.write`.
        trace: a HEAR Mooncake suite's trace file instead of its `workload.trace`.
        calibrate: run a HEAR SCBench suite's FCFS calibration sweep instead of its arms
            (`bench.hear.calibrate`).
        workers: run the suite's units on a local Dask cluster of this many worker processes
            (1: here, in order — the sequential path). A HEAR calibration sweep and a role-modes
            suite always run here (not split into units yet).
        dask_address: run them on the existing Dask scheduler at this address instead.

    Raises:
        ConfigError: a bad scale, a bad part of the suite found when it runs, `trace` /
            `calibrate` for a suite that has no such thing, or a bad `workers` / `dask_address`.
    """
    fanout = Fanout(workers, dask_address)
    suite.check_scale(scale)
    if trace is not None:
        if not isinstance(suite, MooncakeSuite):
            raise ConfigError(f"suite {suite.name}: --trace applies to a HEAR mooncake suite only")
        suite = suite.with_trace(trace)
    if calibrate and not isinstance(suite, ScbenchSuite):
        raise ConfigError(f"suite {suite.name}: --calibrate applies to a HEAR scbench suite only")
    bar = Progress(f"suite {suite.name} ({scale})", key=f"maserve-suite-{suite.name}-progress")

    def step(done: int, total: int, label: str) -> None:
        bar.update(100.0 * done / total)
        if progress is not None:
            progress(done, total, label)

    if calibrate or not isinstance(suite, ReplaySuite | PoolSuite | ScbenchSuite | MooncakeSuite):
        fanout = Fanout()  # a calibration sweep and role modes run here (not split into units yet)
    with fanout:  # one Dask cluster for all the suite's units
        return _dispatch(suite, scale, prefect, step, out, calibrate, fanout)


def _dispatch(
    suite: Suite, scale: str, prefect: bool, step: ProgressFn, out: Path | None, calibrate: bool,
    fanout: Fanout,
) -> SuiteResult:  # fmt: skip
    if isinstance(suite, ReplaySuite):
        replay = run_replay_suite(suite, scale, prefect=prefect, progress=step, fanout=fanout)
        return with_units(SuiteResult(suite, scale, replay.report(), detail=replay), fanout)
    if isinstance(suite, PoolSuite):
        pool = run_pool_suite(suite, scale, progress=step, fanout=fanout)
        return with_units(SuiteResult(suite, scale, pool_report(pool), detail=pool), fanout)
    if isinstance(suite, ScbenchSuite) and calibrate:
        report = run_calibration(suite, scale, step)
    elif isinstance(suite, ScbenchSuite):
        report = run_scbench(suite, scale, out, step, fanout)
    elif isinstance(suite, MooncakeSuite):
        report = run_mooncake(suite, scale, out, step, fanout)
    else:
        report = run_role_modes(suite, scale, out, step)
    report.summary = {"experiment": suite.experiment} | report.summary
    stem = f"{suite.name}.calibration" if calibrate else None
    res = SuiteResult(suite, scale, report, files=list(report.files), stem=stem)
    return with_units(res, fanout)


def with_units(res: SuiteResult, fanout: Fanout) -> SuiteResult:
    """`res` with where its units ran, when they ran on Dask: a header line (the cluster, units
    per worker, the retried units) and the `units` table (one row per unit: worker, attempts,
    wall seconds, why a first attempt failed); a run here, in order, is left as it is."""
    if not fanout.distributed or not fanout.runs:
        return res
    split = ", ".join(f"{w}: {n}" for w, n in sorted(fanout.per_worker().items()))
    lines = [f"units on {fanout.describe()}: {len(fanout.runs)} units ({split})"]
    retried = [r for r in fanout.runs if r.retried]
    if retried:
        lines.append(
            f"RETRIED {len(retried)} unit(s) whose worker died: "
            + ", ".join(f"{r.label} ({r.error})" for r in retried)
        )
    res.report.header += lines
    res.report.tables["units"] = Table(
        fanout.rows(),
        "Units and where they ran (retried: its first worker died; run once more)",
        detail=not retried,
    )
    return res
