"""`maserve bench run SUITE` and `maserve bench serve`: benchmark suites, now or on a schedule.

The one idea: a suite (`bench.suite`) is a list of replay scenarios at a scale; `run` executes
one now as a `maserve-suite` Prefect flow run (`bench.runner.run_suite`) with a progress bar,
prints the per-arm table, the conformance audit and the findings, and with `--out` writes
`<out>/<suite>.json`; `serve` registers every scheduled suite in a folder as a deployment and
serves it (`bench.serve.serve_suites`) against the managed or configured Prefect API.

Exit codes: 0 success; 1 bad input or a failed step (one red line); 3 `run --strict` when an arm
failed its conformance audit.

Examples:
    maserve bench run deployments/suites/finding_barrier.yaml --scale demo --out out/bench
    maserve bench serve --suites deployments/suites
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from maserve_prefect.cli.run_cmd import fail
from maserve_prefect.errors import MaserveError

app = typer.Typer(no_args_is_help=True)

DEFAULT_SUITES = Path("deployments/suites")


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and v != v:  # NaN
        return None
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, str | int | float | bool) or v is None:
        return v
    return str(v)


@app.command("run")
def run_cmd(
    suite: Annotated[Path, typer.Argument(help="Suite YAML file.")],
    scale: Annotated[str, typer.Option(help="demo (CI-sized) or full.")] = "demo",
    out: Annotated[Path | None, typer.Option(help="Write <suite>.json results here.")] = None,
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
            help="Print the task-level metric tables (completion path, stage time, attempts, "
            "SLO, goodput, engine) of every scenario too.",
        ),
    ] = True,
) -> None:
    """Run a benchmark suite now and print its arms, conformance audit, metrics and findings."""
    from maserve_prefect.bench.runner import run_suite
    from maserve_prefect.metrics.report import render_table
    from maserve_prefect.replay.conformance import render

    console = Console(width=140)
    try:
        from maserve_prefect.bench.pool.suite import run_pool_suite_file
        from maserve_prefect.bench.pool.suite_file import is_pool_suite
        from maserve_prefect.bench.pool.tables import render as render_pool

        if is_pool_suite(suite):  # the pool experiment: its own runner and scales
            with ExitStack() as stack:
                if prefect:
                    from maserve_prefect import prefect_server

                    stack.enter_context(prefect_server.connected(prefect_server.ensure_server()))
                render_pool(run_pool_suite_file(suite, scale, out=out), console)
            return
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

            res = run_suite(suite, scale, prefect=prefect, progress=progress)
        console.print(f"suite {res.suite.name} ({scale}): {res.suite.description}".rstrip(": "))
        console.print(render_table("arms", res.arm_rows()))
        console.print(render([rep for reps in res.conformance.values() for rep in reps]))
        if metrics:
            for name, rows in res.metric_rows().items():
                console.print(render_table(name, rows))
        if res.findings:
            console.print(render_table("findings", res.findings))
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            dest = out / f"{res.suite.name}.json"
            dest.write_text(json.dumps(_jsonable(res.to_json()), indent=2, sort_keys=True) + "\n")
            console.print(f"wrote {dest}")
    except MaserveError as exc:
        fail(str(exc))
    if strict and not res.passed:
        fail("an arm run failed its conformance audit (see the table above)", code=3)


@app.command("serve")
def serve_cmd(
    suites: Annotated[
        Path, typer.Option(help="Folder of suite files; those with a `schedule` are served.")
    ] = DEFAULT_SUITES,
    scale: Annotated[str, typer.Option(help="Scale the served suites run at.")] = "demo",
    limit: Annotated[int | None, typer.Option(help="Most suite runs at once.")] = None,
    schedule_every_s: Annotated[
        float, typer.Option(help="How often upcoming runs are scheduled (seconds).", min=0.5)
    ] = 10.0,
) -> None:
    """Serve every scheduled suite as a Prefect deployment (blocks; Ctrl-C stops)."""
    from maserve_prefect import prefect_server
    from maserve_prefect.bench.serve import check_servable, serve_suites

    try:
        check_servable(suites)  # bad or unscheduled suites fail before a server is started
        with prefect_server.connected(prefect_server.ensure_server()):
            served = serve_suites(suites, scale, limit=limit, schedule_every_s=schedule_every_s)
    except MaserveError as exc:
        fail(str(exc))
    Console().print(f"stopped serving {', '.join(served)}")
