"""`maserve` — the command line (typer + rich).

Each command group lives in its own module and is mounted here; a module owns its group.

Every error is one red `error:` line naming what to fix, usage errors too (a bad option value, a
missing argument: `OneLineErrors`), never a traceback or a usage box.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer._click import exceptions as click_errors  # typer >= 0.25 vendors click here
from typer.core import TyperGroup


class OneLineErrors(TyperGroup):
    """The top-level group: click's usage errors become one `error:` line (exit code 2) that
    names the option and points at `--help`, like the commands' own errors."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        from maserve_prefect.cli.checks import print_error

        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click_errors.NoArgsIsHelpError as exc:
            exc.show()  # a bare group: its help, as before
            sys.exit(exc.exit_code)
        except click_errors.ClickException as exc:
            ctx = getattr(exc, "ctx", None)
            where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            print_error(exc.format_message().rstrip(".") + where)
            sys.exit(exc.exit_code)
        except typer.Abort:
            print_error("aborted")
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    name="maserve",
    cls=OneLineErrors,
    help="Multi-agent LLM workloads on Prefect: build, record, replay, simulate.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


def _mount() -> None:
    from maserve_prefect.cli import (
        bench_cmd,
        ledger_cmd,
        replay_cmd,
        run_cmd,
        server_cmd,
        sim_cmd,
        trace_cmd,
    )

    app.add_typer(trace_cmd.app, name="trace", help="Semantic Trace: import, export, stats.")
    app.add_typer(sim_cmd.app, name="sim", help="The embedded vLLM-v1 simulator.")
    app.add_typer(server_cmd.app, name="server", help="The local Prefect server: start, stop.")
    app.add_typer(
        ledger_cmd.app, name="ledger", help="The trace ledger's database: status, migrate."
    )
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
