"""`maserve sim ...` commands: the embedded simulator's tools.

`sim device` / `sim model` manage the user's catalog entries (`cli/sim_catalog.py`);
`sim replay` replays a trace on a simulated pool (`cli/sim_replay.py`); `sim calibrate` is the
older spelling of `sim device calibrate`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from maserve_prefect.cli.checks import check_out_dir
from maserve_prefect.cli.run_cmd import fail
from maserve_prefect.cli.sim_catalog import calibrate_device, device_app, model_app
from maserve_prefect.errors import ConfigError, MaserveError

app = typer.Typer(no_args_is_help=True)
app.add_typer(device_app, name="device")
app.add_typer(model_app, name="model")


@app.command()
def calibrate(
    profile_dir: Annotated[
        Path, typer.Argument(help="Vidur / LLMServingSim profiles of ONE device.")
    ],
    gpu: Annotated[str, typer.Option("--gpu", help="Name of the device entry to write.")],
    base_gpu: Annotated[
        str | None,
        typer.Option(
            "--base-gpu", help="Datasheet entry the factors are relative to (default: --gpu)."
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="YAML file (default $MASERVE_HOME/devices/NAME.yaml)."),
    ] = None,
) -> None:
    """Fit a device entry from measured profiles (same as `maserve sim device calibrate`)."""
    try:
        if out is not None:
            check_out_dir(out.parent, "--out")
            if out.is_dir():
                raise ConfigError(f"--out {out}: a folder; give the path of a .yaml file")
        calibrate_device(gpu, profile_dir, base_gpu, out, Console(width=120))
    except MaserveError as exc:
        fail(str(exc))


def _mount_replay() -> None:
    from maserve_prefect.cli.sim_replay import replay

    app.command("replay")(replay)


_mount_replay()
