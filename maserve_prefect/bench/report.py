"""What every kind of suite hands back to be shown: tables of rows, a few JSON fields, a header.

One idea: a suite of any kind (replay, pool, HEAR) ends as one `Report` — named `Table`s of plain
row dicts (the figures), a `summary` of JSON fields beside them, and a few markdown header lines —
so the terminal, the markdown file, the JSON file and the Prefect artifacts are all rendered from
the same rows (`bench.result.SuiteResult`). A `Table` also says how a report shows it (a title,
optionally a subset of its columns); the JSON always keeps every column. This module imports no
other part of `bench`, so every kind's package can build its report without an import cycle.

Examples:
    >>> t = Table([{"arm": "dag", "p50_s": 1.0, "hash": "ab"}], columns=("arm", "p50_s"))
    >>> t.shown()
    [{'arm': 'dag', 'p50_s': 1.0}]
    >>> jsonable({"x": float("nan"), 1: (2, 3)})
    {'x': None, '1': [2, 3]}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Row = dict[str, Any]

ProgressFn = Callable[[int, int, str], None]
"""Called after each unit of a suite's work with (units done, units in total, a label).

The unit is the kind's natural step: an arm run for replay suites, a (pattern, run, arm) for
pool suites, an arm (per load level, or per development / evaluation set) for HEAR suites."""


@dataclass(frozen=True, slots=True)
class Table:
    """One result table.

    Attributes:
        rows: the figures, one dict per row (every column; what the JSON holds).
        title: the heading a report shows ("" means the table's name).
        columns: the columns a report shows, in order (None: every key of the first row).
        detail: a supporting table that `maserve bench run --no-metrics` leaves out.
    """

    rows: list[Row]
    title: str = ""
    columns: tuple[str, ...] | None = None
    detail: bool = False

    def shown(self) -> list[Row]:
        """The rows restricted to `columns` (a missing cell is None)."""
        return self.rows if self.columns is None else columns_of(self.rows, self.columns)


@dataclass(slots=True)
class Report:
    """A finished suite run of any kind, ready to show.

    Attributes:
        tables: table name → `Table`, in the order a report shows them.
        summary: JSON fields beside the tables (e.g. deadlines, goals, per-run numbers).
        header: markdown lines shown above the tables (workload, pool, capacity).
        passed: False when the run failed an audit (replay conformance); other kinds pass.
        files: files the run wrote besides the results (recorded workloads, a frozen mapping).
    """

    tables: dict[str, Table]
    summary: dict[str, Any] = field(default_factory=dict)
    header: list[str] = field(default_factory=list)
    passed: bool = True
    files: list[Path] = field(default_factory=list)

    def rows(self) -> dict[str, list[Row]]:
        """Table name → rows (every column)."""
        return {name: t.rows for name, t in self.tables.items()}


def jsonable(v: Any) -> Any:
    """`v` with non-finite floats as None, keys as strings, tuples as lists, and any other
    object as its string (so `json.dumps` never fails and never writes NaN)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [jsonable(x) for x in v]
    if isinstance(v, str | int | float | bool) or v is None:
        return v
    return str(v)


def columns_of(rows: Sequence[Row], columns: Sequence[str]) -> list[Row]:
    """`rows` restricted to `columns`, in that order (a missing cell is None)."""
    return [{c: r.get(c) for c in columns} for r in rows]
