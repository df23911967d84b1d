"""Tests for metrics.report: rows, rich tables, PNG plots and Prefect artifacts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure
from rich.console import Console

from maserve_prefect.errors import ConfigError, TraceValidationError
from maserve_prefect.metrics.path import PathSegment, RootPath
from maserve_prefect.metrics.report import (
    Progress,
    artifact_key,
    latency_rows,
    markdown_table,
    path_rows,
    plot_kv_occupancy,
    plot_latency_cdf,
    plot_path_bars,
    plot_root_gantt,
    publish_artifacts,
    publish_plots,
    publish_table,
    render_table,
    slo_rows,
)
from maserve_prefect.metrics.slo import ClassAttainment
from maserve_prefect.metrics.task import RootLatency, RootStatus
from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, OpTimes, RootRecord, Trace

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LATS = [
    RootLatency("r0", "chat", 0.0, RootStatus.COMPLETED, "op", 1.5),
    RootLatency("r1", "chat", 1.0, RootStatus.FAILED, None, None),
]
PATHS = [
    RootPath("r0", "chat", 1.5, (PathSegment("a", None, 0.0, 0.25, 0.5, 0.75),)),
]


def test_rows_and_rich_table() -> None:
    rows = latency_rows(LATS)
    assert rows[1] == {
        "root_id": "r1",
        "class": "chat",
        "status": "failed",
        "arrival_s": 1.0,
        "completed_s": None,
        "latency_s": None,
    }
    assert path_rows(PATHS)[0]["backend_wait_s"] == 0.5
    table = render_table("roots", rows)
    assert table.row_count == 2 and len(table.columns) == 6
    console = Console(width=140, record=True)
    console.print(table)
    text = console.export_text()
    assert "failed" in text and "1.5" in text and "–" in text


def test_markdown_table_lists_every_row() -> None:
    rows = slo_rows({"chat": ClassAttainment("chat", 2.0, 4, 3)})
    md = markdown_table(rows)
    assert md.splitlines()[0] == "| class | deadline_s | num_roots | num_met | attainment |"
    assert md.splitlines()[2] == "| chat | 2 | 4 | 3 | 0.75 |"
    assert markdown_table([]) == ""


def model_then_tool() -> Trace:
    """One root: a model op, then a tool op (which has no first-scheduled time)."""
    return Trace(
        manifest=Manifest(trace_id="t"),
        roots=[RootRecord(root_id="r")],
        ops=[
            OpRecord(op_id="r/a", root_id="r", kind=OpKind.MODEL,
                     times=OpTimes(ready_s=0.0, submitted_s=0.1, first_scheduled_s=0.5,
                                   completed_s=2.0)),
            OpRecord(op_id="r/b", root_id="r", kind=OpKind.TOOL,
                     times=OpTimes(ready_s=2.0, submitted_s=2.0, completed_s=2.5)),
        ],
    )  # fmt: skip


def test_plots_write_pngs(tmp_path: Path) -> None:
    trace = model_then_tool()
    outs = [
        plot_latency_cdf({"dag": [1.0, 2.0, 3.0], "flat": [0.5, 4.0]}, tmp_path / "cdf.png"),
        plot_path_bars({"dag": PATHS, "empty": []}, tmp_path / "path.png"),
        plot_kv_occupancy(
            {"rep": (np.array([0.0, 1.0, 2.0]), np.array([0.0, 2.0**30, 0.5 * 2**30]))},
            tmp_path / "sub" / "kv.png",
        ),
        plot_root_gantt(trace, "r", tmp_path / "gantt.png"),
    ]
    for out in outs:
        data = out.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 1000
    with pytest.raises(TraceValidationError, match="'nope'"):
        plot_root_gantt(trace, "nope", tmp_path / "x.png")


def test_gantt_draws_a_tool_op_without_a_scheduled_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import maserve_prefect.metrics.report as report

    trace = model_then_tool()
    figs: list[Figure] = []
    save = report._save
    monkeypatch.setattr(report, "_save", lambda fig, path: figs.append(fig) or save(fig, path))
    plot_root_gantt(trace, "r", tmp_path / "g.png", title="dag b0: r")
    (ax,) = figs[0].axes
    bars = [(p.get_y() + p.get_height() / 2, p.get_x(), p.get_width()) for p in ax.patches]
    # op a: pre-submission, backend wait, scheduled; op b (row 1): its run as scheduled
    assert [(round(y), x, round(w, 9)) for y, x, w in bars] == [
        (0, 0.0, 0.1), (0, 0.1, 0.4), (0, 0.5, 1.5), (1, 2.0, 0.5)
    ]  # fmt: skip
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "pre-submission", "backend wait", "scheduled"
    ]  # fmt: skip
    assert ax.get_title() == "dag b0: r"


def test_artifact_key() -> None:
    assert artifact_key("maserve-Root latency/p99") == "maserve-root-latency-p99"
    with pytest.raises(ConfigError):
        artifact_key("///")


def test_outside_a_run_publishing_is_a_noop() -> None:
    assert publish_artifacts({"roots": latency_rows(LATS)}) == []
    p = Progress("sweep")
    p.update(10.0)
    assert p.artifact_id is None


def test_artifacts_published_from_a_flow(prefect_api: None, tmp_path: Path) -> None:
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    @flow(name="metrics-report-test", persist_result=False)
    def report_flow() -> tuple[list[str], str | None]:
        from prefect.context import FlowRunContext

        progress = Progress("replay sweep", key="metrics-test-progress")
        ids = publish_artifacts(
            {"root latency": latency_rows(LATS), "paths": path_rows(PATHS)},
            "# Run summary",
            prefix="mtest",
        )
        progress.update(50.0)
        progress.update(150.0)  # clipped to 100
        plot = plot_latency_cdf({"dag": [1.0, 2.0]}, tmp_path / "latency_cdf.png")
        ids += publish_plots([plot], prefix="mtest")
        one = publish_table([{"p50_s": 18.186142426918536}], key="mtest-arm", description="arm")
        ids += [one] if one is not None else []
        ctx = FlowRunContext.get()
        assert ctx is not None and ctx.flow_run is not None
        return [str(i) for i in ids], str(ctx.flow_run.id)

    ids, run_id = report_flow()
    assert len(ids) == 5
    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
        )
    by_key = {a.key: a for a in arts}
    assert set(by_key) == {
        "mtest-root-latency", "mtest-paths", "mtest-report", "metrics-test-progress",
        "mtest-plot-latency-cdf", "mtest-arm",
    }  # fmt: skip
    # a plot reaches the UI as a markdown image (the PNG inline); numbers rounded as printed
    plot_md = str(by_key["mtest-plot-latency-cdf"].data)
    assert by_key["mtest-plot-latency-cdf"].type == "markdown"
    assert "](data:image/png;base64,iVBORw0KGgo" in plot_md
    assert by_key["mtest-arm"].type == "table" and "18.19" in str(by_key["mtest-arm"].data)
    assert "18.186" not in str(by_key["mtest-arm"].data)
    assert by_key["mtest-root-latency"].type == "table"
    assert "r1" in str(by_key["mtest-root-latency"].data)
    report = str(by_key["mtest-report"].data)
    assert report.startswith("# Run summary") and "### paths" in report
    assert by_key["metrics-test-progress"].type == "progress"
    assert float(by_key["metrics-test-progress"].data) == 100.0
