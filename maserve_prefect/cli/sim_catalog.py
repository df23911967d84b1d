"""`maserve sim device ...` and `maserve sim model ...`: the user's own catalog entries.

One idea: a user never edits package source to simulate their hardware or model. A device comes
from a YAML datasheet (`device add`, the fields of the shipped `engines/catalog/data/gpus.yaml`)
or from measured profiles (`device calibrate`, Vidur or LLMServingSim format); a model comes
from its Hugging Face `config.json` (`model add`, a local file). Entries are written under
`$MASERVE_HOME` and found by every lookup afterwards (simulator, pool files, benchmarks). Every
error is one red line and exit status 1; nothing is written unless the whole entry checks out.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from maserve_prefect.cli.run_cmd import fail
from maserve_prefect.engines.catalog.datasheet import load_datasheets
from maserve_prefect.engines.catalog.devices import (
    DeviceEntry,
    calibration_of,
    default_efficiency,
    get_device,
    list_gpus,
    user_devices,
    write_device_file,
)
from maserve_prefect.engines.catalog.gpus import builtin_gpu, list_builtin_gpus
from maserve_prefect.engines.catalog.hf_config import load_hf_config, spec_from_hf_config
from maserve_prefect.engines.catalog.home import user_devices_dir
from maserve_prefect.engines.catalog.models import (
    MODELS,
    get_model,
    model_entry,
    user_models,
    write_model_entry,
)
from maserve_prefect.engines.sim.cost.calibrate import fit_efficiency, leave_one_model_out, score
from maserve_prefect.engines.sim.cost.profiles import GROUPS, load_profiles
from maserve_prefect.errors import ConfigError, MaserveError

device_app = typer.Typer(no_args_is_help=True, help="Devices: list, add a datasheet, calibrate.")
model_app = typer.Typer(no_args_is_help=True, help="Models: list, add a Hugging Face config.json.")


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "device"


@device_app.command("list")
def device_list() -> None:
    """Every known device with its peaks and where its numbers come from."""
    try:
        table = Table(title="Devices (built-in datasheets, then $MASERVE_HOME/devices)")
        cols = ("name", "memory GiB", "BF16/FP16 TFLOPS", "GB/s", "SMs", "L2 MiB", "calibration")
        for col in (*cols, "origin"):
            table.add_column(
                col, justify="left" if col in ("name", "calibration", "origin") else "right"
            )
        users = {e.gpu.name for e in user_devices().values()}
        for name in list_gpus():
            entry = get_device(name)
            g = entry.gpu
            origin = "user" if name in users else (g.source.split(";")[0][:60] or "built-in")
            table.add_row(
                g.name,
                f"{g.memory_bytes / 2**30:.0f}",
                f"{g.peak_flops / 1e12:g}",
                f"{g.mem_bw_bytes_s / 1e9:g}",
                str(g.num_sms),
                f"{g.l2_bytes / 2**20:g}",
                calibration_of(entry),
                origin,
            )
        Console(width=160).print(table)
    except MaserveError as exc:
        fail(str(exc))


@device_app.command("add")
def device_add(
    datasheet: Annotated[Path, typer.Argument(help="YAML datasheet: one entry or a list.")],
    force: Annotated[
        bool, typer.Option("--force", help="Replace a user entry of the same name.")
    ] = False,
) -> None:
    """Add devices from a YAML datasheet to $MASERVE_HOME/devices (fields as in the shipped
    engines/catalog/data/gpus.yaml: name, memory_mib, bf16_tflops / fp16_tflops, mem_bw_gb_s,
    num_sms, l2_mib, interconnect, interconnect_gb_s, host_link, arch, source)."""
    console = Console()
    try:
        specs = load_datasheets(datasheet)
        folder = user_devices_dir()
        planned = []
        for spec in specs:
            path = folder / f"{_slug(spec.name)}.yaml"
            if path.exists() and not force:
                raise ConfigError(f"{path} exists; pass --force to replace device {spec.name!r}")
            planned.append((spec, path))
        for spec, path in planned:
            entry = DeviceEntry(
                spec, default_efficiency(), None, {"datasheet": str(datasheet.resolve())}
            )
            write_device_file(entry, path, efficiency=False)
            note = " (overrides the built-in entry)" if builtin_gpu(spec.name) else ""
            console.print(f"added device {spec.name!r}{note}: wrote {path}")
    except MaserveError as exc:
        fail(str(exc))


@device_app.command("calibrate")
def device_calibrate(
    name: Annotated[str, typer.Argument(help="Device entry to write (new or existing name).")],
    profiles: Annotated[
        Path, typer.Option("--profiles", help="Vidur / LLMServingSim profiles of ONE device.")
    ],
    base_gpu: Annotated[
        str | None,
        typer.Option(
            "--base-gpu",
            help="Known device whose datasheet the factors are relative to "
            "(default: NAME itself, built-in or added with `device add`).",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="YAML file (default $MASERVE_HOME/devices/NAME.yaml)."),
    ] = None,
) -> None:
    """Fit a device's efficiency factors from measured profiles and write its entry.

    Every profile under --profiles is treated as measured on this device (whatever device name
    the files carry). Prints in-sample and held-out-model WAPE per operator group."""
    try:
        calibrate_device(name, profiles, base_gpu, out, Console(width=120))
    except MaserveError as exc:
        fail(str(exc))


def calibrate_device(
    name: str, profile_dir: Path, base_gpu: str | None, out: Path | None, console: Console
) -> Path:
    """Fit, report and write one device entry; returns the written path.

    Raises:
        ConfigError: unknown base device, no profiles, or malformed profile files.
    """
    base_name = base_gpu or name
    try:
        base = get_device(base_name).gpu
    except ConfigError as exc:
        flag = "--base-gpu" if base_gpu else "NAME (no --base-gpu given)"
        raise ConfigError(
            f"{flag} {base_name!r} has no datasheet; pass --base-gpu with one of "
            f"{list_builtin_gpus()} or add its datasheet first with `maserve sim device add`"
        ) from exc
    spec = dataclasses.replace(base, name=name, aliases=())
    coll = load_profiles(profile_dir)
    sets = [dataclasses.replace(s, device=name) for s in coll.sets]
    eff = fit_efficiency(sets, lambda _name: spec, default_efficiency())
    fitted = score(sets, lambda _name: spec, lambda _name: eff)
    held = leave_one_model_out(sets, lambda _name: spec, default_efficiency())
    table = Table(title=f"{name}: WAPE by operator group")
    table.add_column("scoring")
    for group in (*GROUPS, "all"):
        table.add_column(group, justify="right")
    for label, wapes in (("in-sample (not fidelity)", fitted), ("held-out model", held)):
        cells = [wapes.wape(name, g) for g in (*GROUPS, "all")]
        table.add_row(label, *("—" if c is None else f"{100 * c:.1f}%" for c in cells))
    console.print(table)
    console.print({k: round(v, 9) for k, v in eff.to_dict().items()})
    entry = DeviceEntry(
        gpu=spec,
        efficiency=eff,
        base_gpu=base.name,
        fit={
            "profile_dir": str(profile_dir.resolve()),
            "models": coll.models(),
            "num_rows": int(sum(s.seconds.size for s in sets)),
            "in_sample_wape": fitted.wape(name),
            "held_out_model_wape": held.wape(name),
        },
    )
    path = out or user_devices_dir() / f"{_slug(name)}.yaml"
    write_device_file(entry, path)
    console.print(f"wrote {path}")
    return path


@model_app.command("list")
def model_list() -> None:
    """Every known model: layers, parameters (MoE: total / active), KV bytes per token."""
    try:
        table = Table(title="Models (built-in, then $MASERVE_HOME/models)")
        for col in ("name", "layers", "params B", "active B", "KV KiB/token", "experts", "origin"):
            table.add_column(col, justify="left" if col in ("name", "origin") else "right")
        specs = [*MODELS, *{s.name: s for s in user_models().values()}.values()]
        for m in specs:
            experts = f"{m.num_experts_per_tok}/{m.num_experts}" if m.is_moe else "—"
            table.add_row(
                m.name,
                str(m.num_layers),
                f"{m.num_params / 1e9:.2f}",
                f"{m.active_params / 1e9:.2f}",
                f"{m.kv_bytes_per_token / 1024:g}",
                experts,
                "built-in" if m in MODELS else "user",
            )
        Console(width=140).print(table)
    except MaserveError as exc:
        fail(str(exc))


@model_app.command("add")
def model_add(
    config: Annotated[Path, typer.Argument(help="A local Hugging Face config.json.")],
    name: Annotated[str, typer.Option("--name", help="Name the simulator will know it by.")],
    alias: Annotated[
        list[str] | None, typer.Option("--alias", help="Another name (repeatable).")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace a user model of the same name.")
    ] = False,
) -> None:
    """Add a model from its Hugging Face config.json to $MASERVE_HOME/models (nothing is
    downloaded). Dense decoders (Llama, Qwen2/2.5/3, Mistral, Gemma, Phi, InternLM) and
    mixture-of-experts models (Mixtral, Qwen3-MoE)."""
    console = Console()
    try:
        raw = load_hf_config(config)
        spec = spec_from_hf_config(raw, name, str(config), tuple(alias or ()))
        try:
            existing = get_model(name)
        except ConfigError:
            existing = None
        if existing is not None and (existing in MODELS or not force):
            where = "a built-in model" if existing in MODELS else "a user model (--force replaces)"
            raise ConfigError(f"model {name!r} is already {where}: {existing.name}")
        kept = {k: v for k, v in raw.items() if not isinstance(v, dict)}
        path = write_model_entry(model_entry(spec.name, kept, str(config.resolve()), spec.aliases))
        moe = (
            f", MoE {spec.num_experts_per_tok}/{spec.num_experts} experts, "
            f"{spec.active_params / 1e9:.2f} B active"
            if spec.is_moe
            else ""
        )
        console.print(
            f"added model {spec.name!r}: {spec.num_params / 1e9:.2f} B parameters{moe}, "
            f"{spec.kv_bytes_per_token} KV bytes/token; wrote {path}"
        )
    except MaserveError as exc:
        fail(str(exc))
