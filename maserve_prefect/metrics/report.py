"""Reports of task-level metrics: rows, rich tables, PNG plots and Prefect artifacts.

The one idea: every report is first a list of plain row dicts (`*_rows`), and each medium only
renders rows — a rich `Table` for the terminal, a Prefect table artifact, a markdown table — so the
CLI, the UI and a notebook always show the same numbers. Plots draw on bare matplotlib `Figure`s
(Agg canvas: no pyplot state, no display needed) and write PNG files.

Prefect artifacts are created only inside a flow or task run; elsewhere `publish_artifacts` and
`Progress` do nothing but log at debug level, so library code can call them unconditionally.

Examples:
    >>> from maserve_prefect.metrics.task import RootLatency, RootStatus
    >>> rows = latency_rows([RootLatency("r0", "chat", 0.0, RootStatus.COMPLETED, "op", 1.5)])
    >>> rows[0]["latency_s"]
    1.5
    >>> render_table("roots", rows).row_count
    1
"""

from __future__ import annotations

import base64
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast
from uuid import UUID

import numpy as np
from matplotlib.figure import Figure
from rich.table import Table

from maserve_prefect.errors import ConfigError, TraceValidationError
from maserve_prefect.metrics.engine import ReplicaMetrics
from maserve_prefect.metrics.path import SEGMENTS, RootPath
from maserve_prefect.metrics.slo import ClassAttainment
from maserve_prefect.metrics.task import RootLatency
from maserve_prefect.trace.model import Trace

log = logging.getLogger(__name__)
Row = dict[str, Any]

# -- rows --------------------------------------------------------------------------------------


def latency_rows(lats: Sequence[RootLatency]) -> list[Row]:
    """One row per root: id, class, status, arrival, completion and latency (seconds)."""
    return [
        {
            "root_id": r.root_id,
            "class": r.workload_class,
            "status": r.status.value,
            "arrival_s": r.arrival_s,
            "completed_s": r.completed_s,
            "latency_s": r.latency_s,
        }
        for r in lats
    ]


def path_rows(paths: Sequence[RootPath]) -> list[Row]:
    """One row per root: latency, ops on the path and the four segment totals."""
    return [
        {"root_id": p.root_id, "latency_s": p.latency_s, "path_ops": len(p.segments)} | p.totals()
        for p in paths
    ]


def slo_rows(per_class: Mapping[str, ClassAttainment]) -> list[Row]:
    """One row per class: deadline, roots in the window, roots that met it, attainment."""
    return [
        {
            "class": c,
            "deadline_s": a.deadline_s,
            "num_roots": a.num_roots,
            "num_met": a.num_met,
            "attainment": a.attainment,
        }
        for c, a in per_class.items()
    ]


def engine_rows(rows: Sequence[ReplicaMetrics]) -> list[Row]:
    """One row per replica (`metrics.engine.replica_metrics`)."""
    return [asdict(r) for r in rows]


# -- rich --------------------------------------------------------------------------------------


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    return str(v)


def render_table(title: str, rows: Sequence[Row]) -> Table:
    """A rich `Table` with one column per key of the first row (numbers right-aligned)."""
    table = Table(title=title)
    if not rows:
        return table
    for key in rows[0]:
        numeric = isinstance(rows[0][key], int | float)
        table.add_column(key, justify="right" if numeric else "left")
    for row in rows:
        table.add_row(*(_fmt(row.get(k)) for k in rows[0]))
    return table


def markdown_table(rows: Sequence[Row]) -> str:
    """The rows as a GitHub-flavoured markdown table ("" for no rows)."""
    if not rows:
        return ""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(_fmt(r.get(k)) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


# -- plots -------------------------------------------------------------------------------------


def _figure(width: float, height: float) -> tuple[Figure, Any]:
    # A bare Figure renders with the Agg canvas: no pyplot global state, no display needed.
    fig = Figure(figsize=(width, height))
    return fig, fig.subplots()


def _save(fig: Figure, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight", format="png")
    return out


def plot_latency_cdf(arms: Mapping[str, Sequence[float]], path: str | Path) -> Path:
    """Empirical CDF of root latency per arm (one step line each); returns the PNG path."""
    fig, ax = _figure(6, 4)
    for name, values in arms.items():
        x = np.sort(np.asarray(values, dtype=np.float64))
        if x.size:
            ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", label=name)
    ax.set_xlabel("root latency (s)")
    ax.set_ylabel("share of roots")
    ax.set_ylim(0, 1.02)
    ax.legend(loc="lower right")
    return _save(fig, path)


def plot_path_bars(arms: Mapping[str, Sequence[RootPath]], path: str | Path) -> Path:
    """Stacked bars of the mean completion-path segments per arm (seconds)."""
    fig, ax = _figure(6, 4)
    names = list(arms)
    bottom = np.zeros(len(names))
    for seg in SEGMENTS:
        vals = np.array(
            [np.mean([p.totals()[seg] for p in arms[n]]) if arms[n] else 0.0 for n in names]
        )
        ax.bar(names, vals, bottom=bottom, label=seg.removesuffix("_s").replace("_", " "))
        bottom += vals
    ax.set_ylabel("mean time on the completion path (s)")
    ax.legend(fontsize="small")
    return _save(fig, path)


def plot_kv_occupancy(
    series: Mapping[str, tuple[np.ndarray, np.ndarray]], path: str | Path
) -> Path:
    """KV bytes in use over time per replica, `{replica: (t_s, used_bytes)}` (step holds)."""
    fig, ax = _figure(7, 4)
    for name, (t, used) in series.items():
        if len(t):
            ax.step(t, np.asarray(used) / 2**30, where="post", label=name)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("KV cache in use (GiB)")
    ax.legend(fontsize="small")
    return _save(fig, path)


def plot_root_gantt(
    trace: Trace, root_id: str, path: str | Path, *, title: str | None = None
) -> Path:
    """Gantt of one root's ops: ready→submitted, submitted→first scheduled, scheduled→done.

    A missing timestamp takes the one before it, as in the completion-path ledger
    (`metrics.path`): an op without a first-scheduled time (a tool op) draws its whole
    submitted→completed span as scheduled. The title defaults to `root <root_id>`.

    Raises:
        TraceValidationError: the root has no ops in the trace.
    """
    ops = sorted(trace.ops_of_root(root_id), key=lambda o: (o.times.ready_s or 0.0, o.op_id))
    if not ops:
        raise TraceValidationError(
            f"root {root_id!r} has no ops in trace {trace.manifest.trace_id!r}"
        )
    fig, ax = _figure(8, 0.4 * len(ops) + 1.2)
    colors = {"pre-submission": "#c7c7c7", "backend wait": "#ff7f0e", "scheduled": "#1f77b4"}
    labelled: set[str] = set()
    for y, op in enumerate(ops):
        t = op.times
        marks: list[float | None] = []
        for raw in (t.ready_s, t.submitted_s, t.first_scheduled_s, t.completed_s):
            marks.append(raw if raw is not None else (marks[-1] if marks else None))
        for a, b, label in zip(marks, marks[1:], colors, strict=False):
            if a is not None and b is not None and b > a:
                first = label not in labelled
                labelled.add(label)
                ax.barh(y, b - a, left=a, color=colors[label], label=label if first else None)
    ax.set_yticks(range(len(ops)), [o.op_id.removeprefix(f"{root_id}/") for o in ops])
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_title(title or f"root {root_id}")
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, fontsize="small")
    return _save(fig, path)


# -- Prefect artifacts -------------------------------------------------------------------------

_KEY_BAD = re.compile(r"[^a-z0-9-]+")


def artifact_key(name: str) -> str:
    """A valid Prefect artifact key (lowercase letters, digits, dashes) from any name.

    Examples:
        >>> artifact_key("Root latency / fork_join")
        'root-latency-fork-join'
    """
    key = _KEY_BAD.sub("-", name.lower()).strip("-")
    if not key:
        raise ConfigError(f"artifact name {name!r} has no letters or digits to form a key")
    return key


def _in_run() -> bool:
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def _jsonable(rows: Sequence[Row]) -> list[Row]:
    """The rows as a table artifact holds them: floats rounded to 4 significant digits as the
    terminal and markdown tables print them (`_fmt`), non-finite ones None, enums by value.

    Examples:
        >>> _jsonable([{"p50_s": 18.186142426918536, "n": 3, "x": float("nan")}])
        [{'p50_s': 18.19, 'n': 3, 'x': None}]
    """

    def conv(v: Any) -> Any:
        if isinstance(v, float):
            return float(f"{v:.4g}") if math.isfinite(v) else None
        return v.value if hasattr(v, "value") and not isinstance(v, int | float) else v

    return [{k: conv(v) for k, v in r.items()} for r in rows]


def _uuid(result: object) -> UUID:
    # Prefect's artifact helpers dispatch on context: called from sync code they return the UUID.
    return cast(UUID, result)


def publish_artifacts(
    tables: Mapping[str, Sequence[Row]], markdown: str | None = None, *, prefix: str = "maserve"
) -> list[UUID]:
    """Create one Prefect table artifact per table and one markdown report of all of them.

    Keys are `"{prefix}-{table name}"` (see `artifact_key`), so the UI groups runs of the same
    report. Outside a flow or task run this is a no-op that returns `[]`.

    Args:
        tables: report name → rows (`*_rows`).
        markdown: text placed above the tables in the markdown artifact.
        prefix: key prefix.

    Examples:
        >>> publish_artifacts({"roots": []})  # not in a flow run: nothing is created
        []
    """
    if not _in_run():
        log.debug("publish_artifacts: not inside a Prefect flow/task run; nothing published")
        return []
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    ids = []
    parts = [markdown] if markdown else []
    for name, rows in tables.items():
        key = artifact_key(f"{prefix}-{name}")
        ids.append(_uuid(create_table_artifact(_jsonable(rows), key=key, description=name)))
        parts.append(f"### {name}\n\n{markdown_table(rows) or '(no rows)'}")
    md = create_markdown_artifact(
        "\n\n".join(parts), key=artifact_key(f"{prefix}-report"), description="report"
    )
    ids.append(_uuid(md))
    return ids


def png_data_uri(path: str | Path) -> str:
    """A PNG file as a `data:` URI (what an image artifact or a markdown image embeds).

    Raises:
        ConfigError: the file is not a PNG.
    """
    data = Path(path).read_bytes()
    if not data.startswith(b"\x89PNG"):
        raise ConfigError(f"{path}: not a PNG file; plots are published as PNG images")
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def publish_plots(paths: Sequence[str | Path], *, prefix: str = "maserve") -> list[UUID]:
    """Publish PNG plots so the Prefect UI shows them: one markdown artifact per plot, the
    image embedded as a `data:` URI (the UI's artifact pages render markdown images; the image
    artifact type holds a URL the browser must fetch, and these PNGs are local files).

    Keys are `"{prefix}-plot-{file stem}"`; outside a flow or task run this is a no-op.

    Examples:
        >>> publish_plots([])
        []
    """
    if not _in_run():
        log.debug("publish_plots: not inside a Prefect flow/task run; nothing published")
        return []
    from prefect.artifacts import create_markdown_artifact

    ids = []
    for path in paths:
        stem = Path(path).stem
        text = f"### {stem.replace('_', ' ')}\n\n![{stem}]({png_data_uri(path)})"
        key = artifact_key(f"{prefix}-plot-{stem}")
        ids.append(_uuid(create_markdown_artifact(text, key=key, description=f"plot: {stem}")))
    return ids


def publish_table(rows: Sequence[Row], *, key: str, description: str) -> UUID | None:
    """One table artifact (numbers rounded as printed); None outside a flow or task run."""
    if not _in_run():
        return None
    from prefect.artifacts import create_table_artifact

    return _uuid(
        create_table_artifact(_jsonable(rows), key=artifact_key(key), description=description)
    )


class Progress:
    """A Prefect progress artifact for a long run (no-op outside a flow or task run).

    Examples:
        >>> p = Progress("replay sweep")
        >>> p.update(50.0)  # outside a run: nothing happens
        >>> p.artifact_id is None
        True
    """

    def __init__(self, description: str, *, key: str | None = None) -> None:
        self.description = description
        self.artifact_id: UUID | None = None
        if not _in_run():
            log.debug("Progress: not inside a Prefect flow/task run; progress is not published")
            return
        from prefect.artifacts import create_progress_artifact

        self.artifact_id = _uuid(
            create_progress_artifact(
                0.0, key=artifact_key(key) if key else None, description=description
            )
        )

    def update(self, percent: float) -> None:
        """Set progress to `percent` (0–100, clipped)."""
        if self.artifact_id is None:
            return
        from prefect.artifacts import update_progress_artifact

        update_progress_artifact(self.artifact_id, float(min(max(percent, 0.0), 100.0)))
