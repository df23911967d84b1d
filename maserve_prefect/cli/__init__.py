"""`maserve` — the command line (typer + rich).

Each command group lives in its own module and is mounted here; a module owns its group.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="maserve",
    help="Multi-agent LLM workloads on Prefect: build, record, replay, simulate.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


def _mount() -> None:
    from maserve_prefect.cli import bench_cmd, replay_cmd, run_cmd, server_cmd, sim_cmd, trace_cmd

    app.add_typer(trace_cmd.app, name="trace", help="Semantic Trace: import, export, stats.")
    app.add_typer(sim_cmd.app, name="sim", help="The embedded vLLM-v1 simulator.")
    app.add_typer(server_cmd.app, name="server", help="The local Prefect server: start, stop.")
    app.command("run")(run_cmd.run_cmd)
    app.command("replay")(replay_cmd.replay_cmd)
    app.add_typer(
        bench_cmd.app, name="bench", help="Benchmark suites: run one, serve on schedules."
    )


@app.command()
def version() -> None:
    """Print the package version."""
    from maserve_prefect import __version__

    typer.echo(__version__)


def main() -> None:
    """Console-script entry point."""
    try:
        _mount()  # imports every command group: seconds on a busy machine
    except KeyboardInterrupt:
        raise SystemExit(130) from None  # Ctrl-C before any command ran: quietly, as typer does
    app()
