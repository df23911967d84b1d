"""The `maserve-suite` Prefect flow — what `maserve bench run` calls and `maserve bench serve`
deploys, for a suite of any kind — and `run_suite`, the way to run a suite file now.

One idea: the flow is a thin wrapper around the one runner (`bench.runner.execute_suite`): it
loads the suite file, runs it, records its flow-run id, publishes the tables as Prefect
artifacts (`SuiteResult.publish`) and, given `out`, writes the results; it returns the
`SuiteResult` itself, which an in-process caller receives as the flow call's return value (the
flow does not persist results, so nothing is serialized). The caller's progress callback is a
flow parameter (Prefect stores it as a placeholder; a served run has none). The flow lives at
module level in this module so a served deployment can load it by module path
(`maserve_prefect.bench.flow.maserve_suite`) in the runner's flow-run subprocess, from an
editable install or a wheel alike; importing it imports Prefect, so other modules import this
one lazily.

Examples:
    >>> maserve_suite.name
    'maserve-suite'
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, tags

from maserve_prefect.bench.fanout import Fanout
from maserve_prefect.bench.report import ProgressFn
from maserve_prefect.bench.result import SuiteResult
from maserve_prefect.bench.runner import execute_suite
from maserve_prefect.bench.suite import load_suite


def suite_tag(name: str) -> str:
    """The Prefect tag of a suite's flow runs and of every run it starts.

    Examples:
        >>> suite_tag("finding-barrier")
        'suite:finding-barrier'
    """
    return f"suite:{name}"


@flow(name="maserve-suite", persist_result=False, log_prints=False, validate_parameters=False)
def maserve_suite(
    path: str,
    scale: str = "demo",
    out: str | None = None,
    progress: ProgressFn | None = None,
    trace: str | None = None,
    calibrate: bool = False,
    workers: int = 1,
    dask_address: str | None = None,
) -> SuiteResult:
    """Run a benchmark suite of any kind as one flow run: the kind's work (a progress artifact
    advances after each unit), then every table (`SuiteResult.tables`) as a table artifact plus
    one markdown report.

    Args:
        path: the suite YAML file.
        scale: one of the suite's scales.
        out: a folder for the results (`<suite>.json`, `<suite>.md`) and the run's side files.
        progress: called after each unit of work (in-process callers only).
        trace: a HEAR Mooncake suite's trace file instead of its `workload.trace`.
        calibrate: a HEAR SCBench suite's FCFS calibration sweep instead of its arms.
        workers: run the units as `maserve-suite-unit` task runs of this flow run on a local
            Dask cluster of this many workers (`bench.fanout`; 1: in this process, in order).
        dask_address: on the existing Dask scheduler at this address instead.

    Returns:
        The suite's result (`SuiteResult.to_json` is its JSON form).
    """
    from prefect.runtime import flow_run

    folder = Path(out) if out is not None else None
    suite = load_suite(path)
    with tags(suite_tag(suite.name)):  # every flow run the suite starts (native roots, arms)
        res = execute_suite(suite, scale, prefect=True, progress=progress, out=folder,
                            trace=Path(trace) if trace is not None else None,
                            calibrate=calibrate, workers=workers,
                            dask_address=dask_address)  # fmt: skip
    res.flow_run_id = str(flow_run.id)
    res.publish()
    if folder is not None:
        res.write(folder)
    return res


def run_suite(
    path: str | Path,
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
    """Run a suite file of any kind now: one `maserve-suite` flow run (needs a Prefect API),
    or none.

    Args:
        path: the suite YAML file.
        scale: one of the suite's scales (replay: demo / full; pool and HEAR: as the file names).
        prefect: run as a Prefect flow run with artifacts; False runs the same work bare.
        progress: called after each unit of work (`bench.report.ProgressFn`).
        out: write `<out>/<suite>.json` and `<out>/<suite>.md` (and the run's side files).
        trace: a HEAR Mooncake suite's trace file instead of its `workload.trace`.
        calibrate: a HEAR SCBench suite's FCFS calibration sweep instead of its arms.
        workers: local Dask workers for the suite's units (`bench.fanout`; 1: here, in order).
        dask_address: an existing Dask scheduler for them instead (`tcp://HOST:8786`).

    Raises:
        ConfigError: a bad suite file, scale, part of the suite (file and key named), worker
            count or Dask address.

    Examples:
        >>> run_suite("/nonexistent.yaml", prefect=False)
        Traceback (most recent call last):
        ...
        maserve_prefect.errors.ConfigError: suite /nonexistent.yaml: cannot read it: [Errno 2] No such file or directory: '/nonexistent.yaml'
    """
    suite = load_suite(path)  # parse errors surface before a flow run is created
    suite.check_scale(scale)
    Fanout(workers, dask_address)  # so do a bad worker count or address
    if not prefect:
        res = execute_suite(suite, scale, prefect=False, progress=progress, out=out,
                            trace=trace, calibrate=calibrate, workers=workers,
                            dask_address=dask_address)  # fmt: skip
        if out is not None:
            res.write(out)
        return res
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with (
        temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}),
        tags(suite_tag(suite.name)),
    ):
        return maserve_suite.with_options(flow_run_name=f"{suite.name}-{scale}")(
            str(Path(path).resolve()),
            scale,
            str(out) if out is not None else None,
            progress,
            str(Path(trace).resolve()) if trace is not None else None,
            calibrate,
            workers,
            dask_address,
        )
