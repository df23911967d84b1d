"""`maserve sim ...` commands: the embedded simulator's tools (calibrate a device entry)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from maserve_prefect.cli.checks import check_out_dir
from maserve_prefect.cli.run_cmd import fail
from maserve_prefect.engines.catalog.devices import (
    DeviceEntry,
    default_efficiency,
    user_devices_dir,
    write_device_file,
)
from maserve_prefect.engines.catalog.gpus import builtin_gpu, list_builtin_gpus
from maserve_prefect.engines.sim.cost.calibrate import fit_efficiency, leave_one_model_out, score
from maserve_prefect.engines.sim.cost.profiles import GROUPS, load_profiles
from maserve_prefect.errors import ConfigError, MaserveError

app = typer.Typer(no_args_is_help=True)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "device"


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
    """Fit a device entry (efficiency factors) from measured profiles and write it as YAML.

    Every profile under PROFILE_DIR is treated as measured on this device. Efficiencies above 1
    mean the card beats its datasheet. `get_gpu(NAME)` and `make_step_model(..., NAME)` load
    the written entry.
    """
    try:
        if out is not None:
            check_out_dir(out.parent, "--out")
            if out.is_dir():
                raise ConfigError(f"--out {out}: a folder; give the path of a .yaml file")
        _calibrate(profile_dir, gpu, base_gpu, out)
    except MaserveError as exc:
        fail(str(exc))


def _calibrate(profile_dir: Path, gpu: str, base_gpu: str | None, out: Path | None) -> None:
    base_name = base_gpu or gpu
    base = builtin_gpu(base_name)
    if base is None:
        raise ConfigError(
            f"--base-gpu {base_name!r} has no datasheet entry; pass one of {list_builtin_gpus()}"
        )
    spec = dataclasses.replace(base, name=gpu, aliases=())
    coll = load_profiles(profile_dir)
    sets = [dataclasses.replace(s, device=gpu) for s in coll.sets]
    eff = fit_efficiency(sets, lambda _name: spec, default_efficiency())
    fitted = score(sets, lambda _name: spec, lambda _name: eff)
    held = leave_one_model_out(sets, lambda _name: spec, default_efficiency())
    console = Console(width=120)
    table = Table(title=f"{gpu}: WAPE by operator group")
    table.add_column("scoring")
    for group in (*GROUPS, "all"):
        table.add_column(group, justify="right")
    for label, wapes in (("in-sample (not fidelity)", fitted), ("held-out model", held)):
        cells = [wapes.wape(gpu, g) for g in (*GROUPS, "all")]
        table.add_row(label, *("—" if c is None else f"{100 * c:.1f}%" for c in cells))
    console.print(table)
    console.print({k: round(v, 9) for k, v in eff.to_dict().items()})
    held_all = held.wape(gpu)
    entry = DeviceEntry(
        gpu=spec,
        efficiency=eff,
        base_gpu=base.name,
        fit={
            "profile_dir": str(profile_dir.resolve()),
            "models": coll.models(),
            "num_rows": int(sum(s.seconds.size for s in sets)),
            "in_sample_wape": fitted.wape(gpu),
            "held_out_model_wape": held_all,
        },
    )
    path = out or user_devices_dir() / f"{_slug(gpu)}.yaml"
    write_device_file(entry, path)
    console.print(f"wrote {path}")


def _mount_replay() -> None:
    from maserve_prefect.cli.sim_replay import replay

    app.command("replay")(replay)


_mount_replay()
