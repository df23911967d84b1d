"""Training and evaluation rows: one observed (model, device, shape) and what it cost.

One idea: every source — the simulator sweep, compositions of real operator measurements, later a
real engine — yields the same flat `Row`, and a target a source did not observe is NaN (never a
guess): fitting and scoring skip NaN targets per target. Rows round-trip through CSV exactly
(floats are written with `repr`).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from maserve_prefect.predictors.base import TARGETS, Shape

from maserve_prefect.errors import ConfigError

NAN = float("nan")


@dataclass(frozen=True, slots=True)
class Row:
    """One observation. `modelled_share` is the fraction of `runtime_s` that came from a model
    rather than a measurement (0 for fully measured or simulated rows; see `measured.py`).

    Examples:
        >>> r = Row("Qwen3-8B", "H100", 1, 128, 16, 0.2, NAN, NAN, "measured")
        >>> r.shape, r.has("runtime_s"), r.has("load_s")
        (Shape(batch=1, input_len=128, output_len=16), True, False)
    """

    model: str
    device: str
    batch: int
    input_len: int
    output_len: int
    runtime_s: float
    peak_mem_bytes: float
    load_s: float
    source: str
    modelled_share: float = 0.0

    @property
    def shape(self) -> Shape:
        return Shape(self.batch, self.input_len, self.output_len)

    def target(self, name: str) -> float:
        if name not in TARGETS:
            raise ConfigError(f"unknown target {name!r}; expected one of {TARGETS}")
        value: float = getattr(self, name)
        return value

    def has(self, name: str) -> bool:
        """Whether target `name` was observed (finite and positive)."""
        value = self.target(name)
        return math.isfinite(value) and value > 0


_FIELDS = tuple(f.name for f in fields(Row))
_FLOATS = ("runtime_s", "peak_mem_bytes", "load_s", "modelled_share")


def write_rows(rows: Iterable[Row], path: Path) -> Path:
    """Write `rows` as CSV with a header (parent folders created); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=_FIELDS)
        writer.writeheader()
        for row in rows:
            record = asdict(row)
            for name in _FLOATS:
                record[name] = repr(float(record[name]))
            writer.writerow(record)
    return path


def read_rows(path: Path) -> list[Row]:
    """Read a CSV written by `write_rows`.

    Raises:
        ConfigError: missing columns or a bad value; names the file and line.
    """
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [f for f in _FIELDS if f not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"{path}:1: missing columns {missing}; expected {list(_FIELDS)}")
        rows = []
        for line_no, rec in enumerate(reader, start=2):
            try:
                row = Row(
                    model=rec["model"],
                    device=rec["device"],
                    batch=int(rec["batch"]),
                    input_len=int(rec["input_len"]),
                    output_len=int(rec["output_len"]),
                    runtime_s=float(rec["runtime_s"]),
                    peak_mem_bytes=float(rec["peak_mem_bytes"]),
                    load_s=float(rec["load_s"]),
                    source=rec["source"],
                    modelled_share=float(rec["modelled_share"]),
                )
            except ValueError as exc:
                raise ConfigError(f"{path}:{line_no}: bad number ({exc})") from exc
            rows.append(row)
    return rows
