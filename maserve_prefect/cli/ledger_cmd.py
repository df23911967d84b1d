"""`maserve ledger status|migrate`: the trace ledger's database and its schema version.

The one idea: thin commands over `trace.schema`. Opening a ledger already upgrades an older
database in place; these commands let a user see where the ledger is and at which version
(`status`), and run or preview the upgrade on its own (`migrate`, `migrate --check`) — e.g. on a
PostgreSQL ledger shared by several machines, before the first run of a new release. A database
newer than this code is refused and left untouched. Errors are one red line and exit code 1.

Examples:
    maserve ledger status
    maserve ledger migrate --check --url postgresql+psycopg://me@db.lab/maserve
    maserve ledger migrate
"""

from __future__ import annotations

import json
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from sqlalchemy import create_engine
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from maserve_prefect.errors import MaserveError
from maserve_prefect.settings import get_settings
from maserve_prefect.trace.schema import (
    LEDGER_SCHEMA_VERSION,
    ensure_schema,
    pending_migrations,
    read_version,
)

app = typer.Typer(no_args_is_help=True)

UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url", help="Ledger database URL (default: $MASERVE_LEDGER_URL or the SQLite file)."
    ),
]


def _fail(message: str) -> NoReturn:
    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=1)


def _open(url: str | None) -> tuple[Engine, str]:
    """The database without creating or altering anything (unlike `trace.db.make_engine`)."""
    raw = url or get_settings().ledger_url
    try:
        parsed = make_url(raw)
    except ArgumentError as exc:
        _fail(f"ledger URL {raw!r} is not a database URL ({exc})")
    shown = parsed.render_as_string(hide_password=True)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        from pathlib import Path

        if not Path(str(parsed.database)).expanduser().exists():
            _fail(f"ledger database {shown} does not exist; nothing to show or migrate")
    return create_engine(parsed), shown


@app.command("status")
def status_cmd(
    url: UrlOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Show the ledger's database, its schema version and what an upgrade would apply."""
    engine, shown = _open(url)
    try:
        found = read_version(engine)
        todo = [m.name for m in pending_migrations(engine)]
    except SQLAlchemyError as exc:
        _fail(f"ledger database {shown}: {exc.__class__.__name__}: {str(exc).splitlines()[0]}")
    finally:
        engine.dispose()
    state = (
        "empty"
        if found is None
        else "newer than this code"
        if found > LEDGER_SCHEMA_VERSION
        else "needs upgrade"
        if todo or found < LEDGER_SCHEMA_VERSION
        else "current"
    )
    info = {
        "url": shown,
        "backend": engine.dialect.name,
        "schema_version": found,
        "code_schema_version": LEDGER_SCHEMA_VERSION,
        "pending": todo,
        "state": state,
    }
    if as_json:
        typer.echo(json.dumps(info, sort_keys=True))
        return
    table = Table(title="Trace ledger", show_header=False)
    table.add_column("field")
    table.add_column("value")
    for key, value in info.items():
        table.add_row(key, ", ".join(value) if isinstance(value, list) else str(value))
    Console().print(table)


@app.command("migrate")
def migrate_cmd(
    url: UrlOption = None,
    check: Annotated[
        bool, typer.Option("--check", help="Only report what would be applied; write nothing.")
    ] = False,
) -> None:
    """Upgrade the ledger's schema in place to this code's version (never downgrades)."""
    engine, shown = _open(url)
    console = Console()
    try:
        todo = pending_migrations(engine)
        report = ensure_schema(engine, check_only=check)
    except MaserveError as exc:
        _fail(str(exc))
    except SQLAlchemyError as exc:
        _fail(f"ledger database {shown}: {exc.__class__.__name__}: {str(exc).splitlines()[0]}")
    finally:
        engine.dispose()
    found = "empty" if report.found is None else f"version {report.found}"
    if check:
        steps = ", ".join(f"{m.name} (v{m.version}: {m.why})" for m in todo) or "nothing"
        console.print(
            f"ledger {shown}: {found}; this code writes version {LEDGER_SCHEMA_VERSION}; "
            f"would apply: {steps}",
            highlight=False,
        )
        return
    if report.created:
        console.print(f"ledger {shown}: created at version {report.version}", highlight=False)
    elif report.applied:
        console.print(
            f"ledger {shown}: {found} → version {report.version}; applied "
            f"{', '.join(report.applied)}",
            highlight=False,
        )
    else:
        console.print(f"ledger {shown}: already at version {report.version}", highlight=False)
