"""`maserve bench run SUITE` and `maserve bench serve`: benchmark suites of any kind, now or on a
schedule.

The one idea: a suite file (`bench.suite`) is a replay, pool or HEAR suite at a scale; `run`
executes one now as a `maserve-suite` Prefect flow run (`bench.flow.run_suite`) with a progress
bar (units: arm runs for replay, (pattern, run, arm) for pool, arms for HEAR), prints its tables
(replay: arms, the conformance audit, the metric tables, the findings; pool and HEAR: the
experiment's tables) and with `--out` writes `<out>/<suite>.json` and `<out>/<suite>.md`;
`--no-prefect` runs the same work without a suite flow run; `--workers N` fans the units out on
a local Dask cluster of N worker processes (`--dask-address tcp://HOST:8786`: an existing one;
`bench.fanout`), with the same results; `--trace` gives a HEAR Mooncake suite
another trace, `--calibrate` runs a HEAR SCBench suite's FCFS calibration sweep instead of its
arms. `serve` registers every scheduled
suite in a folder, of any kind, as a deployment and serves it (`bench.serve.serve_suites`)
against the managed or configured Prefect API.

Exit codes: 0 success; 1 bad input or a failed step (one red line); 3 `run --strict` when an arm
failed its conformance audit; 4 a replay suite's arm run failed the audit's work checks (an op
failed or never completed, the work changed, an early release — the tables and files are written
first; `--allow-failures` exits 0 instead).

Examples:
    maserve bench run deployments/suites/finding_barrier.yaml --scale demo --out out/bench
    maserve bench run deployments/suites/pool_hetero.yaml --scale medium
    maserve bench run deployments/suites/hear_scbench.yaml --workers 2
    maserve bench run deployments/suites/pool_hetero.yaml --dask-address tcp://10.0.0.5:8786
    maserve bench run deployments/suites/hear_scbench.yaml --scale full --no-prefect
    maserve bench run deployments/suites/hear_scbench.yaml --scale full --calibrate
    maserve bench run deployments/suites/hear_mooncake.yaml --trace my_mooncake_trace.jsonl
    maserve bench serve --suites deployments/suites
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from maserve_prefect.cli.checks import EXIT_FAILED_WORK, check_out_dir
from maserve_prefect.cli.run_cmd import fail
from maserve_prefect.errors import MaserveError

if TYPE_CHECKING:
    from maserve_prefect.bench.result import SuiteResult

app = typer.Typer(no_args_is_help=True)


WorkersOption = Annotated[
    int,
    typer.Option(
        min=1,
        help="Run the suite's units (arm runs, pool runs, HEAR arms) on a local Dask cluster "
        "of this many worker processes (1: in this process, in order).",
    ),
]
DaskAddressOption = Annotated[
    str | None,
    typer.Option(
        help="Run the units on this existing Dask scheduler (tcp://HOST:8786) instead; its "
        "workers need maserve-prefect installed and reach the Prefect API.",
    ),
]

DEFAULT_SUITES = Path("deployments/suites")


def print_result(console: Console, res: SuiteResult, *, metrics: bool = True) -> None:
    """Print a suite result: its header, then every table under its title (shown columns); a
    replay suite's conformance audit as its own table; `metrics=False` leaves out the detail
    tables (a replay suite's metric tables)."""
    from maserve_prefect.bench.replay.suite import ReplaySuiteResult
    from maserve_prefect.metrics.report import render_table
    from maserve_prefect.replay.conformance import render

    console.print(f"suite {res.suite.name} ({res.scale}): {res.suite.description}".rstrip(": "))
    for line in res.report.header:
        console.print(line, markup=False, highlight=False)
    for name, table in res.report.tables.items():
        if table.detail and not metrics:
            continue
        if name == "conformance" and isinstance(res.detail, ReplaySuiteResult):
            console.print(render([r for reps in res.detail.conformance.values() for r in reps]))
        else:
            console.print(render_table(table.title or name, table.shown()))


@app.command("run")
def run_cmd(
    suite: Annotated[Path, typer.Argument(help="Suite YAML file (kind: replay, pool or hear).")],
    scale: Annotated[
        str, typer.Option(help="A scale of the suite: demo (CI-sized), full, or one it names.")
    ] = "demo",
    out: Annotated[
        Path | None, typer.Option(help="Write <suite>.json and <suite>.md results here.")
    ] = None,
    prefect: Annotated[
        bool, typer.Option("--prefect/--no-prefect", help="Record the suite as a Prefect flow run.")
    ] = True,
    strict: Annotated[
        bool, typer.Option(help="Exit 3 when an arm run fails its conformance audit.")
    ] = False,
    metrics: Annotated[
        bool,
        typer.Option(
            "--metrics/--no-metrics",
            help="Print a replay suite's task-level metric tables (completion path, stage time, "
            "attempts, SLO, goodput, engine) of every scenario too.",
        ),
    ] = True,
    trace: Annotated[
        Path | None,
        typer.Option(help="A HEAR mooncake suite: replay this Mooncake-format trace instead."),
    ] = None,
    calibrate: Annotated[
        bool,
        typer.Option(
            "--calibrate",
            help="A HEAR scbench suite: run its FCFS-only calibration sweep (the workload knobs "
            "the paper leaves unstated) instead of its arms.",
        ),
    ] = False,
    allow_failures: Annotated[
        bool,
        typer.Option(
            "--allow-failures", help="Exit 0 even when a replay arm run failed its work checks."
        ),
    ] = False,
    workers: WorkersOption = 1,
    dask_address: DaskAddressOption = None,
) -> None:
    """Run a benchmark suite of any kind now and print its tables."""
    from maserve_prefect.bench.fanout import Fanout
    from maserve_prefect.bench.flow import run_suite
    from maserve_prefect.bench.replay.suite import ReplaySuiteResult
    from maserve_prefect.bench.suite import load_suite

    console = Console(width=140)
    try:
        load_suite(suite).check_scale(scale)  # a bad file or scale fails before a server starts
        Fanout(workers, dask_address)  # so do a bad worker count or address
        if out is not None:
            check_out_dir(out, "--out")
        with ExitStack() as stack:
            if prefect:
                from maserve_prefect import prefect_server

                stack.enter_context(prefect_server.connected(prefect_server.ensure_server()))
            bar = stack.enter_context(
                Progress(
                    TextColumn("{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    console=console,
                    transient=True,
                )
            )
            task = bar.add_task(f"suite {suite.stem}", total=None)

            def progress(done: int, total: int, label: str) -> None:
                bar.update(task, completed=done, total=total, description=label)

            res = run_suite(suite, scale, prefect=prefect, progress=progress, out=out,
                            trace=trace, calibrate=calibrate, workers=workers,
                            dask_address=dask_address)  # fmt: skip
        print_result(console, res, metrics=metrics)
        for path in res.files:
            console.print(f"wrote {path}")
    except MaserveError as exc:
        fail(str(exc))
    if strict and not res.passed:
        fail("an arm run failed its conformance audit (see the table above)", code=3)
    if isinstance(res.detail, ReplaySuiteResult) and not res.detail.work_ok and not allow_failures:
        fail(
            "an arm run failed the audit's work checks (failed or incomplete ops, changed work "
            "or early releases; see the conformance table); pass --allow-failures to exit 0",
            code=EXIT_FAILED_WORK,
        )


@app.command("serve")
def serve_cmd(
    suites: Annotated[
        Path,
        typer.Option(help="Folder of suite files; those with a `schedule` are served (any kind)."),
    ] = DEFAULT_SUITES,
    scale: Annotated[
        str, typer.Option(help="Scale the served suites run at (each must have it).")
    ] = "demo",
    limit: Annotated[int | None, typer.Option(help="Most suite runs at once.")] = None,
    schedule_every_s: Annotated[
        float, typer.Option(help="How often upcoming runs are scheduled (seconds).", min=0.5)
    ] = 10.0,
    workers: WorkersOption = 1,
    dask_address: DaskAddressOption = None,
) -> None:
    """Serve every scheduled suite, of any kind, as a Prefect deployment (blocks; Ctrl-C stops)."""
    from maserve_prefect import prefect_server
    from maserve_prefect.bench.fanout import Fanout
    from maserve_prefect.bench.serve import check_servable, serve_suites, serving_line

    console = Console()
    try:
        check_servable(suites, scale)  # bad or unscheduled suites fail before a server starts
        Fanout(workers, dask_address)
        console.print(serving_line(suites, scale), highlight=False, soft_wrap=True)
        server = prefect_server.ensure_server(
            announce=lambda line: console.print(line, highlight=False, soft_wrap=True)
        )
        with prefect_server.connected(server):
            where = f"UI {server.ui_url}" if server.ui_url else f"API {server.url}"
            console.print(f"runs appear in Prefect ({where}); Ctrl-C stops serving",
                          highlight=False, soft_wrap=True)  # fmt: skip
            served = serve_suites(suites, scale, limit=limit, schedule_every_s=schedule_every_s,
                                  workers=workers, dask_address=dask_address)  # fmt: skip
    except MaserveError as exc:
        fail(str(exc))
    console.print(f"stopped serving {', '.join(served)}")
