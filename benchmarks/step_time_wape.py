"""Fidelity of the roofline step-time model against measured kernel profiles (WAPE).

Usage:
    python benchmarks/step_time_wape.py [PROFILE_DIR ...] [--write]

Reads every Vidur / LLMServingSim profile under the given directories (default
`../shared/data/profiles`), and prints WAPE = sum|pred - meas| / sum(meas) per device and
operator group for:

- in-sample: each device fitted on all of its rows and scored on them — NOT a fidelity figure;
- leave-one-model-out (LOMO): each device fitted without one model, scored on that model;
- leave-one-device-out (LODO): shared factors fitted on the other devices, scored on the
  held-out device (only groups the other devices measured);
- unfitted: hand-set `DeviceEfficiency()` defaults, the baseline a fit must beat.

The headline per device is the held-out (LOMO) WAPE over all its operator rows, against the 5%
goal, and the held-out-device (LODO) WAPE against 10% (the goal for datacenter GPUs). A second
table breaks the LOMO and LODO figures down per operator (attention by regime), with each
operator's share of the device's measured seconds. `--write` refits on ALL rows and writes the package's shipped device efficiencies
(`maserve_prefect/engines/catalog/data/device_efficiency.json`); the held-out figures above come
from refits that exclude the scored rows and are unaffected by it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from maserve_prefect.engines.catalog.devices import get_gpu, shipped_fit_path
from maserve_prefect.engines.catalog.gpus import GpuSpec
from maserve_prefect.engines.sim.cost.calibrate import (
    WapeTable,
    fit_all,
    in_sample,
    leave_one_device_out,
    leave_one_model_out,
    unfitted,
)
from maserve_prefect.engines.sim.cost.profiles import GROUPS, load_profiles
from maserve_prefect.errors import ConfigError, MaserveError

GOAL = 0.05
LODO_GOAL = 0.10
DEFAULT_DIR = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "profiles"


def _gpu(name: str) -> GpuSpec:
    """The datasheet peaks of a profiled device: built-in, or added with `maserve sim device
    add` (a calibrated user entry's own efficiencies are not used: every score here refits)."""
    try:
        return get_gpu(name)
    except ConfigError as exc:
        raise ConfigError(
            f"profiles name device {name!r}, which is not in the catalog; add its datasheet with "
            "`maserve sim device add DATASHEET.yaml` (fields as in "
            "maserve_prefect/engines/catalog/data/gpus.yaml) and rerun"
        ) from exc


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _operator_table(
    devices: list[str], fitted: WapeTable, lomo: WapeTable, lodo: WapeTable
) -> Table:
    """Per operator: share of the device's measured seconds, LOMO and LODO WAPE."""
    table = Table(title="Per-operator WAPE (held-out model / held-out device)")
    for col in ("device", "operator", "share of time", "LOMO", "LODO"):
        table.add_column(col, justify="left" if col in ("device", "operator") else "right")
    for device in devices:
        total = fitted.meas.get((device, "all"), 0.0)
        for op in fitted.operators(device):
            key = f"op:{op}"
            share = fitted.meas.get((device, key), 0.0) / total if total else None
            cells = ("—" if share is None else f"{100 * share:.2f}%", _fmt(lomo.wape(device, key)))
            table.add_row(device, op, *cells, _fmt(lodo.wape(device, key)))
        table.add_section()
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*", type=Path, default=[DEFAULT_DIR])
    parser.add_argument("--write", action="store_true", help="write the shipped device fit")
    args = parser.parse_args()
    try:
        run(args.dirs, args.write)
    except MaserveError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        raise SystemExit(1) from None


def run(dirs: list[Path], write: bool) -> None:
    """Score (and with `write`, refit the shipped efficiencies); see the module docstring.

    Raises:
        ConfigError: no profiles, a malformed file, or a device the catalog does not know.
    """
    coll = load_profiles(*dirs)
    sets = coll.sets
    for device in coll.devices():
        _gpu(device)  # every device resolves before any fit starts
    console = Console(width=150)
    runs: list[tuple[str, WapeTable]] = [
        ("in-sample, not a fidelity figure", in_sample(sets, _gpu)),
        ("held-out model (LOMO)", leave_one_model_out(sets, _gpu)),
        ("held-out device (LODO)", leave_one_device_out(sets, _gpu)),
        ("unfitted defaults", unfitted(sets, _gpu)),
    ]
    table = Table(title="Step-time model WAPE vs measured kernel profiles")
    table.add_column("device")
    table.add_column("scoring")
    for group in (*GROUPS, "all"):
        table.add_column(group, justify="right")
    for device in coll.devices():
        for label, wapes in runs:
            cells = [_fmt(wapes.wape(device, g)) for g in (*GROUPS, "all")]
            table.add_row(device, label, *cells)
        table.add_section()
    console.print(table)
    console.print(_operator_table(coll.devices(), runs[0][1], runs[1][1], runs[2][1]))
    console.print(f"models per device: { {d: coll.models(d) for d in coll.devices()} }")
    if coll.skipped:
        console.print(f"not modelled (skipped): {coll.skipped}")
    lomo, lodo = runs[1][1], runs[2][1]
    for device in coll.devices():
        held = lomo.wape(device)
        status = "n/a (one model)" if held is None else ("meets" if held <= GOAL else "MISSES")
        other = lodo.wape(device)
        lodo_status = "n/a" if other is None else ("meets" if other < LODO_GOAL else "MISSES")
        console.print(
            f"[bold]{device}[/]: held-out-model WAPE {_fmt(held)} ({status} goal {GOAL:.0%}); "
            f"held-out-device WAPE {_fmt(other)} ({lodo_status} goal {LODO_GOAL:.0%}); "
            f"linear layers held-out-model {_fmt(lomo.wape(device, 'linear'))}"
        )
    if write:
        pooled, per_device = fit_all(sets, _gpu)
        doc = {
            "fitted_on": sorted(
                {Path(s.source).parent.as_posix().split("profiles/")[-1] for s in sets}
            ),
            "written_by": "benchmarks/step_time_wape.py --write",
            "default": pooled.to_dict(),
            "devices": {d: e.to_dict() for d, e in per_device.items()},
        }
        path = shipped_fit_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2) + "\n")
        console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
