"""Device datasheets in YAML: the one schema the shipped catalog and `maserve sim device add` read.

One idea: a datasheet is a flat mapping in the units vendors print (TFLOPS, GB/s, MiB, SM
count), checked field by field into a `GpuSpec` in SI units; every error is one line naming the
file, the entry and the field. The shipped entries live in `data/gpus.yaml`, whose header
explains each field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from maserve_prefect.errors import ConfigError

MIB = 1 << 20
GB = 10**9
TFLOPS = 10**12


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Datasheet facts about one accelerator model (SI units).

    Examples:
        >>> from maserve_prefect.engines.catalog.gpus import builtin_gpu
        >>> gpu = builtin_gpu("h100")
        >>> gpu.mem_bw_bytes_s / 1e12 if gpu else None
        3.35
    """

    name: str
    memory_bytes: int
    peak_flops: float  # dense 16-bit tensor peak (BF16, else FP16), FP32 accumulate
    mem_bw_bytes_s: float
    interconnect_bytes_s: float  # per-GPU GPU-to-GPU bandwidth (NVLink, else PCIe)
    host_link_bytes_s: float  # host <-> device (PCIe) per direction, sustained
    interconnect: str = "pcie"
    aliases: tuple[str, ...] = ()
    # Streaming multiprocessors and L2 bytes: the attention kernel's wave width and the cache its
    # GQA query heads share KV through. Defaults (an A100-like part) only for unknown devices.
    num_sms: int = 108
    l2_bytes: int = 40 * MIB
    arch: str = ""  # compute architecture (sm80, sm89, gfx942...): picks attention tiles
    source: str = ""  # where the numbers come from (datasheet / whitepaper name)


# PCIe sustained per-direction throughput: Gen3 ~12 GB/s, Gen4 ~25 GB/s, Gen5 ~50 GB/s (about
# 80% of the 16 / 32 / 64 GB/s link rates, the usual pinned-memory cudaMemcpy figure).
PCIE_GB_S = {"pcie3": 12.0, "pcie4": 25.0, "pcie5": 50.0, "pcie6": 100.0}
INTERCONNECTS = ("nvlink", "pcie", "infinity-fabric", "ub")
REQUIRED = ("name", "memory_mib", "mem_bw_gb_s", "num_sms", "l2_mib")
OPTIONAL = (
    "aliases",
    "vendor",
    "source",
    "arch",
    "bf16_tflops",
    "fp16_tflops",
    "interconnect",
    "interconnect_gb_s",
    "host_link",
    "host_link_gb_s",
    "unverified",
    "notes",
)


def _number(doc: dict[str, Any], key: str, where: str, integer: bool = False) -> float:
    raw = doc[key]
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ConfigError(f"{where}: {key}={raw!r} is not a number")
    if not raw > 0:
        raise ConfigError(f"{where}: {key}={raw} must be > 0")
    if integer and raw != int(raw):
        raise ConfigError(f"{where}: {key}={raw} must be a whole number")
    return float(raw)


def parse_datasheet(doc: Any, where: str) -> GpuSpec:
    """One datasheet mapping -> `GpuSpec` (peaks in bytes, FLOP/s and bytes/s).

    Raises:
        ConfigError: a field is missing, unknown or out of range (one line, naming `where`).

    Examples:
        >>> spec = parse_datasheet({"name": "X", "memory_mib": 1024, "fp16_tflops": 10,
        ...     "mem_bw_gb_s": 100, "num_sms": 8, "l2_mib": 2}, "x.yaml")
        >>> spec.peak_flops, spec.host_link_bytes_s
        (10000000000000.0, 25000000000.0)
    """
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: expected a mapping of datasheet fields, got {doc!r:.60}")
    name = doc.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}: needs a string 'name'")
    where = f"{where} ({name})"
    unknown = sorted(set(doc) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise ConfigError(f"{where}: unknown fields {unknown}; expected {[*REQUIRED, *OPTIONAL]}")
    missing = [key for key in REQUIRED if doc.get(key) is None]
    if missing:
        raise ConfigError(f"{where}: missing {missing}")
    peaks = [key for key in ("bf16_tflops", "fp16_tflops") if doc.get(key) is not None]
    if not peaks:
        raise ConfigError(f"{where}: give bf16_tflops or fp16_tflops (dense, FP32 accumulate)")
    peak = _number(doc, peaks[0], where)
    for key in peaks[1:]:
        _number(doc, key, where)
    link = str(doc.get("interconnect", "pcie"))
    if link not in INTERCONNECTS:
        raise ConfigError(f"{where}: interconnect={link!r}; expected one of {INTERCONNECTS}")
    if doc.get("host_link_gb_s") is not None:
        host = _number(doc, "host_link_gb_s", where)
    else:
        gen = str(doc.get("host_link", "pcie4"))
        if gen not in PCIE_GB_S:
            raise ConfigError(
                f"{where}: host_link={gen!r}; expected one of {sorted(PCIE_GB_S)} "
                "or a host_link_gb_s number"
            )
        host = PCIE_GB_S[gen]
    if doc.get("interconnect_gb_s") is not None:
        peer = _number(doc, "interconnect_gb_s", where)
    elif link == "pcie":
        peer = host
    else:
        raise ConfigError(f"{where}: interconnect {link} needs interconnect_gb_s")
    aliases = doc.get("aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise ConfigError(f"{where}: aliases must be a list of strings")
    return GpuSpec(
        name=name.strip(),
        memory_bytes=int(_number(doc, "memory_mib", where, integer=True)) * MIB,
        peak_flops=peak * TFLOPS,
        mem_bw_bytes_s=_number(doc, "mem_bw_gb_s", where) * GB,
        interconnect_bytes_s=peer * GB,
        host_link_bytes_s=host * GB,
        interconnect=link,
        aliases=tuple(aliases),
        num_sms=int(_number(doc, "num_sms", where, integer=True)),
        l2_bytes=int(_number(doc, "l2_mib", where) * MIB),
        arch=str(doc.get("arch", "")),
        source=str(doc.get("source", "")),
    )


def load_datasheets(path: Path) -> list[GpuSpec]:
    """Every entry of a datasheet file (one mapping or a list of mappings).

    Raises:
        ConfigError: unreadable YAML or a bad entry; the message names the file and entry.
    """
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}{line}: not valid YAML ({problem})") from exc
    docs = doc if isinstance(doc, list) else [doc]
    if not docs:
        raise ConfigError(f"{path}: no datasheet entries")
    return [parse_datasheet(d, f"{path} entry {i + 1}") for i, d in enumerate(docs)]
