"""`maserve server start|stop|status`: the persistent local Prefect server, by hand.

The one idea: thin commands over `maserve_prefect.prefect_server`. `maserve run` starts the
server on demand; these commands let a user start it ahead of time (e.g. on a fixed port to open
the API from elsewhere), check it, and stop it. Errors are one red line and exit code 1.

The server serves the Prefect UI at its root URL unless started with `--no-ui` (or
`MASERVE_PREFECT_UI=0`); the "View at …" links Prefect prints open there.

Examples:
    maserve server start --port 4242
    maserve server start --no-ui
    maserve server status
    maserve server stop
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from maserve_prefect import prefect_server
from maserve_prefect.errors import MaserveError

app = typer.Typer(no_args_is_help=True)

HomeOption = Annotated[
    Path | None,
    typer.Option("--home", help="Server PREFECT_HOME (default: $MASERVE_HOME/prefect)."),
]


def _fail(message: str) -> NoReturn:
    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=1)


def _table(info: prefect_server.ServerInfo) -> Table:
    table = Table(title="Prefect server", show_header=False)
    table.add_column("field")
    table.add_column("value")
    table.add_row("running", "[green]yes[/]" if info.running else "[red]no[/]")
    table.add_row("home", str(info.home))
    if info.url is not None:
        table.add_row("url", info.url)
        table.add_row("ui", info.ui_url or "[dim]off (--no-ui)[/]")
    if info.pid is not None:
        table.add_row("pid", str(info.pid))
    if info.uptime_s is not None:
        table.add_row("uptime", f"{info.uptime_s:.0f} s")
    table.add_row("log", str(info.log_path))
    return table


@app.command("start")
def start_cmd(
    home: HomeOption = None,
    port: Annotated[
        int | None,
        typer.Option(help=f"TCP port (default: ${prefect_server.ENV_PREFECT_PORT} or a free one)."),
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the API to answer.")] = 90.0,
    ui: Annotated[
        bool | None,
        typer.Option(
            "--ui/--no-ui",
            help=f"Serve the Prefect UI at the server's root URL (default: on; "
            f"${prefect_server.ENV_PREFECT_UI}=0 turns it off).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Start the local Prefect server (or report the one already running)."""
    console = Console()
    try:
        before = prefect_server.status(home)
        with console.status("starting the Prefect server…"):
            info = prefect_server.start(home, port, timeout_s=timeout, ui=ui)
    except MaserveError as exc:
        _fail(str(exc))
    verb = "already running" if before.running and before.pid == info.pid else "started"
    where = f"{info.url}; UI {info.ui_url}" if info.ui_url else f"{info.url} (no UI)"
    console.print(f"Prefect server {verb} at {where}", highlight=False)
    if verb == "already running" and ui is not None and ui != info.ui:
        console.print(
            f"[yellow]note:[/] it was started {'with' if info.ui else 'without'} the UI; "
            f"`maserve server stop` first to change that",
            highlight=False,
        )
    console.print(_table(info))


@app.command("stop")
def stop_cmd(
    home: HomeOption = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait before SIGKILL.")] = 20.0,
) -> None:
    """Stop the local Prefect server."""
    try:
        stopped = prefect_server.stop(home, timeout_s=timeout)
    except MaserveError as exc:
        _fail(str(exc))
    Console().print("Prefect server stopped" if stopped else "no Prefect server was running")


@app.command("status")
def status_cmd(
    home: HomeOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Show whether the local Prefect server runs, where, and for how long."""
    try:
        info = prefect_server.status(home)
    except MaserveError as exc:
        _fail(str(exc))
    if as_json:
        typer.echo(json.dumps(info.as_dict(), sort_keys=True))
    else:
        Console().print(_table(info))
