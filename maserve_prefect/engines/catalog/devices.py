"""Device entries: a GPU's datasheet plus its efficiency factors, from three layered sources.

One idea: lookups go user entry → shipped fit → datasheet + default efficiency.

1. User entries `$MASERVE_HOME/devices/*.yaml` (default `~/.maserve`), written by
   `maserve sim device add` (a datasheet) or `maserve sim device calibrate` (a fit): they may
   define a new device or override a built-in one.
2. `data/device_efficiency.json` shipped in this package: efficiencies fitted on every profile
   in `../shared/data/profiles` by `benchmarks/step_time_wape.py --write`.
3. The datasheet entry in `data/gpus.yaml` with the shipped pooled default efficiency.

A device YAML file looks like::

    name: RTX PRO 6000 (lab)
    aliases: [lab6000]
    base_gpu: RTX PRO 6000
    gpu: {memory_bytes: ..., peak_flops: ..., mem_bw_bytes_s: ..., interconnect_bytes_s: ...,
          host_link_bytes_s: ..., interconnect: pcie, num_sms: ..., l2_bytes: ..., arch: sm120}
    efficiency: {linear_mem: 0.82, ...}          # absent: the shipped pooled fit
    fit: {profile_dir: ..., num_rows: ..., held_out_wape: ...}   # informational
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from maserve_prefect.engines.catalog.efficiency import DEFAULT_EFFICIENCY, DeviceEfficiency
from maserve_prefect.engines.catalog.gpus import (
    GpuSpec,
    builtin_gpu,
    gpu_key,
    list_builtin_gpus,
    unknown_gpu_error,
)
from maserve_prefect.engines.catalog.home import user_devices_dir
from maserve_prefect.errors import ConfigError

SHIPPED_FIT = "device_efficiency.json"
_GPU_FIELDS = (
    "memory_bytes",
    "peak_flops",
    "mem_bw_bytes_s",
    "interconnect_bytes_s",
    "host_link_bytes_s",
)


@dataclass(frozen=True, slots=True)
class DeviceEntry:
    """A device as the simulator sees it: datasheet peaks, efficiencies and provenance."""

    gpu: GpuSpec
    efficiency: DeviceEfficiency
    base_gpu: str | None = None
    fit: dict[str, Any] = field(default_factory=dict)


def shipped_fit_path() -> Path:
    return Path(str(resources.files("maserve_prefect.engines.catalog") / "data" / SHIPPED_FIT))


@cache
def _shipped() -> tuple[DeviceEfficiency, dict[str, DeviceEfficiency]]:
    path = shipped_fit_path()
    if not path.exists():
        return DEFAULT_EFFICIENCY, {}
    data = json.loads(path.read_text())
    default = DeviceEfficiency.from_dict(data.get("default", {}), f"{path} (default)")
    devices = {
        gpu_key(name): DeviceEfficiency.from_dict(values, f"{path} ({name})")
        for name, values in data.get("devices", {}).items()
    }
    return default, devices


def default_efficiency() -> DeviceEfficiency:
    """Efficiency for a device with no fit of its own (the shipped pooled fit)."""
    return _shipped()[0]


def load_device_file(path: Path) -> DeviceEntry:
    """Parse one device YAML file.

    Raises:
        ConfigError: the file is malformed; the message names the file and the field.
    """
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise ConfigError(f"{path}: expected a mapping with a string 'name' field")
    name = data["name"]
    base_name = data.get("base_gpu")
    base = builtin_gpu(base_name) if isinstance(base_name, str) else builtin_gpu(name)
    raw_gpu = data.get("gpu") or {}
    if not isinstance(raw_gpu, dict):
        raise ConfigError(f"{path}: 'gpu' must be a mapping of {list(_GPU_FIELDS)}")
    values: dict[str, float] = {}
    for key in _GPU_FIELDS:
        if key in raw_gpu:
            try:
                values[key] = float(raw_gpu[key])
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{path}: gpu.{key}={raw_gpu[key]!r} is not a number") from exc
        elif base is not None:
            values[key] = float(getattr(base, key))
        else:
            raise ConfigError(
                f"{path}: gpu.{key} missing and no known base_gpu to take it from "
                f"(set base_gpu to one of {list_builtin_gpus()})"
            )
    gpu = GpuSpec(
        name=name,
        memory_bytes=int(values["memory_bytes"]),
        peak_flops=values["peak_flops"],
        mem_bw_bytes_s=values["mem_bw_bytes_s"],
        interconnect_bytes_s=values["interconnect_bytes_s"],
        host_link_bytes_s=values["host_link_bytes_s"],
        interconnect=str(raw_gpu.get("interconnect", base.interconnect if base else "pcie")),
        num_sms=_optional_gpu_count(raw_gpu, base, path, "num_sms"),
        l2_bytes=_optional_gpu_count(raw_gpu, base, path, "l2_bytes"),
        arch=str(raw_gpu.get("arch", base.arch if base else "")),
        source=str(raw_gpu.get("source", base.source if base else "")),
    )
    eff_raw = data.get("efficiency") or {}
    if not isinstance(eff_raw, dict):
        raise ConfigError(f"{path}: 'efficiency' must be a mapping")
    checked = DeviceEfficiency.from_dict(eff_raw, str(path)).to_dict()
    eff = default_efficiency().updated({key: checked[key] for key in eff_raw})
    aliases = data.get("aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise ConfigError(f"{path}: aliases must be a list of strings")
    fit = data.get("fit") or {}
    if not isinstance(fit, dict):
        raise ConfigError(f"{path}: 'fit' must be a mapping")
    return DeviceEntry(
        replace(gpu, aliases=tuple(aliases)),
        eff,
        base_name if isinstance(base_name, str) else None,
        dict(fit),
    )


_UNKNOWN_GPU = GpuSpec("unknown", 0, 0.0, 0.0, 0.0, 0.0)  # only for GpuSpec's field defaults


def _optional_gpu_count(raw_gpu: dict[str, Any], base: GpuSpec | None, path: Path, key: str) -> int:
    """`num_sms` / `l2_bytes` from the file, else the base GPU, else `GpuSpec`'s default."""
    raw = raw_gpu.get(key, getattr(base, key) if base is not None else None)
    if raw is None:
        default: int = getattr(_UNKNOWN_GPU, key)
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: gpu.{key}={raw!r} is not an integer") from exc
    if value < 1:
        raise ConfigError(f"{path}: gpu.{key}={value} must be >= 1")
    return value


def write_device_file(entry: DeviceEntry, path: Path, efficiency: bool = True) -> Path:
    """Write `entry` as YAML (creating parent folders, replacing atomically); returns the path.

    `efficiency=False` leaves the factors out, so the device follows the shipped pooled fit
    (what a datasheet-only device added with `maserve sim device add` wants)."""
    gpu = asdict(entry.gpu)
    gpu.pop("name")
    aliases = list(gpu.pop("aliases"))
    doc: dict[str, Any] = {"name": entry.gpu.name, "aliases": aliases, "base_gpu": entry.base_gpu}
    doc["gpu"] = gpu
    if efficiency:
        doc["efficiency"] = entry.efficiency.to_dict()
    doc["fit"] = entry.fit
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.replace(path)
    return path


def user_devices() -> dict[str, DeviceEntry]:
    """User device entries keyed by normalised name (later files win on duplicates)."""
    folder = user_devices_dir()
    if not folder.is_dir():
        return {}
    entries: dict[str, DeviceEntry] = {}
    for path in sorted(folder.glob("*.yaml")):
        entry = load_device_file(path)
        for alias in (entry.gpu.name, *entry.gpu.aliases):
            entries[gpu_key(alias)] = entry
    return entries


def get_device(name: str) -> DeviceEntry:
    """Resolve a device by name: user entry, else datasheet with shipped or default efficiency.

    Raises:
        ConfigError: unknown name; the message lists the known devices.

    Examples:
        >>> get_device("A100-80GB").gpu.peak_flops / 1e12
        312.0
    """
    user = user_devices().get(gpu_key(name))
    if user is not None:
        return user
    gpu = builtin_gpu(name)
    if gpu is None:
        raise unknown_gpu_error(name, list_gpus())
    default, fitted = _shipped()
    eff = fitted.get(gpu_key(gpu.name), default)
    return DeviceEntry(
        gpu, eff, None, {"source": "shipped fit" if gpu_key(gpu.name) in fitted else "default"}
    )


def calibration_of(entry: DeviceEntry) -> str:
    """`fitted` when the device's step-time efficiencies were fitted on its own profiles (the
    shipped fit, or `maserve sim device calibrate`), else `uncalibrated` (the pooled default fit
    over the datasheet's peaks).

    Examples:
        >>> calibration_of(get_device("A100-80GB")), calibration_of(get_device("Ascend 910C"))
        ('fitted', 'uncalibrated')
    """
    fitted = entry.fit.get("source") == "shipped fit" or "profile_dir" in entry.fit
    return "fitted" if fitted else "uncalibrated"


def get_gpu(name: str) -> GpuSpec:
    """The `GpuSpec` for a device name or alias (user entries included).

    Examples:
        >>> get_gpu("v100").memory_bytes // 2**30
        32
    """
    return get_device(name).gpu


def get_efficiency(name: str) -> DeviceEfficiency:
    """The efficiency factors the step model uses for device `name`."""
    return get_device(name).efficiency


def list_gpus() -> list[str]:
    """Built-in device names followed by user-defined ones."""
    names = list_builtin_gpus()
    for entry in user_devices().values():
        if builtin_gpu(entry.gpu.name) is None and entry.gpu.name not in names:
            names.append(entry.gpu.name)
    return names
