"""GPU catalog: datasheet peaks that the roofline step model divides by.

One idea: a device is four numbers — memory, peak dense 16-bit tensor FLOPS, memory bandwidth
and the links weights and activations travel over — plus SM count and L2 size for the attention
wave model, and fitted efficiency factors that say how much of those peaks real kernels reach
(`engines/catalog/efficiency.py`). The built-in entries, each with its source (vendor datasheet
or whitepaper), are package data: `data/gpus.yaml`, parsed by `datasheet.py` with the same
checks a user datasheet gets from `maserve sim device add FILE`.

Consumer / workstation cards often run above or below these numbers; `maserve sim device
calibrate` fits a device entry from measured profiles instead of trusting the datasheet.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from maserve_prefect.engines.catalog.datasheet import GB, MIB, TFLOPS, GpuSpec, load_datasheets
from maserve_prefect.errors import ConfigError

__all__ = [
    "GB",
    "GPUS",
    "MIB",
    "TFLOPS",
    "GpuSpec",
    "builtin_gpu",
    "datasheet_path",
    "gpu_key",
    "list_builtin_gpus",
    "unknown_gpu_error",
]

DATASHEET_FILE = "gpus.yaml"


def datasheet_path() -> Path:
    """The shipped datasheet file."""
    return Path(str(resources.files("maserve_prefect.engines.catalog") / "data" / DATASHEET_FILE))


GPUS: tuple[GpuSpec, ...] = tuple(load_datasheets(datasheet_path()))


def gpu_key(name: str) -> str:
    """Normalised lookup key: case, spaces, dashes and underscores do not matter."""
    return "".join(ch for ch in name.lower() if ch.isalnum())


_BY_KEY: dict[str, GpuSpec] = {}
for _spec in GPUS:
    for _alias in (_spec.name, *_spec.aliases):
        if _BY_KEY.get(gpu_key(_alias), _spec) is not _spec:
            raise RuntimeError(f"duplicate GPU alias {_alias!r} in {datasheet_path()}")
        _BY_KEY[gpu_key(_alias)] = _spec


def builtin_gpu(name: str) -> GpuSpec | None:
    """The datasheet entry for `name`, or None (user device entries are not consulted)."""
    return _BY_KEY.get(gpu_key(name))


def list_builtin_gpus() -> list[str]:
    return [g.name for g in GPUS]


def unknown_gpu_error(name: str, known: list[str]) -> ConfigError:
    """The one error every lookup of an unknown device raises: what is known, how to add it."""
    return ConfigError(
        f"unknown GPU {name!r}; known GPUs: {', '.join(known)}. Add it with "
        "`maserve sim device add DATASHEET.yaml` (fields as in the shipped "
        "engines/catalog/data/gpus.yaml), or fit one from profiles with "
        "`maserve sim device calibrate NAME --profiles DIR --base-gpu KNOWN_GPU`."
    )
