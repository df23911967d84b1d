"""`maserve replay SCENARIO`: metric tables, plots, Prefect artifacts and the engine fallback."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer
import yaml
from typer.testing import CliRunner

from maserve_prefect.cli import replay_cmd
from maserve_prefect.trace.bundle import export_bundle, import_bundle
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.model import (
    Dep,
    EdgeKind,
    GenerationSettings,
    Manifest,
    OpKind,
    OpRecord,
    OpStatus,
    RootRecord,
    StageRecord,
    Trace,
)

app = typer.Typer()
app.command("replay")(replay_cmd.replay_cmd)


@app.callback()
def _group() -> None:
    """Keep `replay` a named subcommand."""


runner = CliRunner()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_trace(num_roots: int = 12) -> Trace:
    """Two classes: `toy` roots (model draft -> model review -> tool check, two stages) and
    `chat` roots (one model op), alternating; every root names its final op."""
    roots, stages, ops = [], [], []
    gen = GenerationSettings(deployment="main")
    for i in range(num_roots):
        r = f"r{i}"
        if i % 2:
            roots.append(
                RootRecord(
                    root_id=r, workflow="chat", arrival_s=float(i), final_op_id=f"{r}/answer"
                )
            )
            stages.append(StageRecord(stage_id=f"{r}/s", root_id=r, name="answer"))
            ops.append(
                OpRecord(
                    op_id=f"{r}/answer",
                    root_id=r,
                    stage_id=f"{r}/s",
                    kind=OpKind.MODEL,
                    generation=gen,
                    num_input_tokens=300,
                    num_output_tokens=24,
                )
            )
            continue
        roots.append(
            RootRecord(root_id=r, workflow="toy", arrival_s=float(i), final_op_id=f"{r}/check")
        )
        stages += [
            StageRecord(stage_id=f"{r}/d", root_id=r, name="draft"),
            StageRecord(stage_id=f"{r}/v", root_id=r, name="review"),
        ]
        ops += [
            OpRecord(op_id=f"{r}/draft", root_id=r, stage_id=f"{r}/d", kind=OpKind.MODEL,
                     generation=gen, num_input_tokens=512, num_output_tokens=48),
            OpRecord(op_id=f"{r}/review", root_id=r, stage_id=f"{r}/v", kind=OpKind.MODEL,
                     generation=gen, num_input_tokens=640, num_output_tokens=16,
                     deps=(Dep(op_id=f"{r}/draft", kind=EdgeKind.CONTROL),)),
            OpRecord(op_id=f"{r}/check", root_id=r, stage_id=f"{r}/v", kind=OpKind.TOOL,
                     tool_name="t", tool_duration_s=0.25,
                     deps=(Dep(op_id=f"{r}/review", kind=EdgeKind.CONTROL),)),
        ]  # fmt: skip
    return Trace(manifest=Manifest(trace_id="toy2"), roots=roots, stages=stages, ops=ops)


def write_scenario(folder: Path, name: str = "rep", **extra: Any) -> Path:
    """A bundle of `make_trace()` and a scenario with locked deadlines and three arms: DAG,
    Flat, and DAG on a KV cache small enough to preempt at this arrival rate."""
    export_bundle(make_trace(), MemoryStore(), folder / "bundle", overwrite=True)
    data: dict[str, Any] = {
        "name": name,
        "cohorts": [{"name": "t", "bundle": "bundle"}],
        "lock": "length",
        "arrivals": {"kind": "poisson", "rate_per_s": 50.0, "seed": 3},
        "deadlines": {"reference": {"factor": 1.5, "quantile": 0.95}},
        "arms": [
            {"name": "dag", "release": "dag"},
            {"name": "flat", "release": "flat"},
            {"name": "small", "release": "dag", "overrides": {"main": {"kv_cache_gib": 0.15}}},
        ],
    } | extra
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _printed_row(text: str, title: str, first_cell: str) -> dict[str, str]:
    """Header → cell of the first row starting with `first_cell` in the table `title`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == title)
    header = next(line for line in lines[start:] if line.startswith("┃"))
    row = next(line for line in lines[start:] if line.startswith(f"│ {first_cell} "))
    cells = [c.strip() for c in row.split("│")[1:-1]]
    return dict(zip([h.strip() for h in header.split("┃")[1:-1]], cells, strict=True))


def _cell(v: Any) -> str:
    """How `metrics.report.render_table` prints a value."""
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def test_replay_prints_metric_tables_and_writes_plots(tmp_path: Path) -> None:
    path = write_scenario(tmp_path)
    out, plots = tmp_path / "out", tmp_path / "plots"
    res = runner.invoke(
        app, ["replay", str(path), "--no-prefect", "--out", str(out), "--plots", str(plots)]
    )
    assert res.exit_code == 0, res.output
    text = res.output
    titles = {line.strip() for line in text.splitlines()}
    for title in ("completion path", "stage time", "attempts", "slo", "goodput", "engine",
                  "replicas", "co-batching", "preemptions"):  # fmt: skip
        assert title in titles, title
    for header in ("backend_wait", "scheduled_residence", "prefill_factor", "decode_batch",
                   "goodput_per_accel_s", "kv_gib_s", "intensity"):  # fmt: skip
        assert header in text, header
    # roots by status, and the state every arm started from (the simulator: a fresh pool)
    assert "done/failed/incompl." in text and "every arm started from:" in text

    for name in ("latency_cdf.png", "path_bars.png", "kv_occupancy.png", "root_gantt.png"):
        data = (plots / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000, name

    # Independent figures from the DAG arm's replay bundle: deadline attainment per class,
    # goodput over the declared window [0, T) — T = N / λ = 12 roots / 50 per s, starting at the
    # first arrival (a Poisson cohort's first gap is 0) — and the output tokens the roots consumed.
    summary = json.loads((out / "summary.json").read_text())
    deadlines = summary["deadlines_s"]
    trace = import_bundle(out / "dag-b0").trace
    ops = {o.op_id: o for o in trace.ops}
    met: dict[str, list[bool]] = {}
    arrivals = [root.arrival_s for root in trace.roots]
    first, period = min(arrivals), 12 / 50.0
    num_met_in_window = 0
    for root in trace.roots:
        final = ops[root.final_op_id or ""]
        assert final.status is OpStatus.COMPLETED and final.times.completed_s is not None
        ok = final.times.completed_s - root.arrival_s <= deadlines[root.workflow]
        met.setdefault(root.workflow, []).append(ok)
        num_met_in_window += ok and first <= root.arrival_s < first + period
    slo = [r for r in summary["tables"]["slo"] if r["arm"] == "dag"]
    assert {r["class"]: (r["roots"], r["met"]) for r in slo} == {
        c: (len(v), sum(v)) for c, v in met.items()
    }
    assert {r["class"]: r["attainment"] for r in slo} == {
        c: sum(v) / len(v) for c, v in met.items()
    }
    dag_goodput = next(r for r in summary["tables"]["goodput"] if r["arm"] == "dag")
    assert dag_goodput["window_s"] == pytest.approx(period)
    assert dag_goodput["goodput_per_s"] == pytest.approx(num_met_in_window / period)
    assert 0 < dag_goodput["timely_rate_per_s"] < dag_goodput["goodput_per_s"]  # drain > T
    done = next(
        r for r in summary["tables"]["attempts"]
        if (r["arm"], r["status"]) == ("dag", "completed")
    )  # fmt: skip
    assert done["roots"] == 12
    assert (
        done["output_tokens"] == sum(o.num_output_tokens for o in trace.ops) == 6 * (48 + 16 + 24)
    )

    # the path shares of every root add up to one (the ledger reconciles), and the printed
    # completion-path row carries the same numbers as the JSON
    paths = summary["tables"]["completion path"]
    shares = ("boundary_gap", "pre_submission", "backend_wait", "scheduled_residence")
    for row in paths:
        assert np.isclose(sum(row[k] for k in shares), 1.0)
    dag_row = next(r for r in paths if r["arm"] == "dag")
    assert _printed_row(text, "completion path", "dag") == {k: _cell(v) for k, v in dag_row.items()}

    # the engine table: the prefill factor is 1 without preemption and grows with the
    # recomputation after it; preemptions by class add up to the arm's preemptions
    engine = {r["arm"]: r for r in summary["tables"]["engine"]}
    assert list(engine) == ["dag", "flat", "small"]
    assert all(engine[a]["prefill_factor"] == 1.0 and engine[a]["preemptions"] == 0
               for a in ("dag", "flat"))  # fmt: skip
    assert engine["small"]["preemptions"] > 0 and engine["small"]["prefill_factor"] > 1.0
    by_class = [r for r in summary["tables"]["preemptions"] if r["arm"] == "small"]
    assert sum(r["preemptions"] for r in by_class) == engine["small"]["preemptions"]
    assert {r["class"] for r in by_class} <= {"toy", "chat"}
    goodput = summary["tables"]["goodput"]
    assert all(r["accelerators"] >= 1 for r in goodput)
    for r in goodput:
        assert r["goodput_per_accel_s"] == pytest.approx(r["goodput_per_s"] / r["accelerators"])


def test_engine_defaults_to_the_scenario_field(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, engine="tgi:http://localhost:1")
    res = runner.invoke(app, ["replay", str(path), "--no-prefect"])
    assert res.exit_code == 1
    assert "'tgi:http://localhost:1'" in res.output and "expected 'sim'" in res.output
    # an explicit --engine still wins over the file's field
    res = runner.invoke(app, ["replay", str(path), "--no-prefect", "--engine", "sim"])
    assert res.exit_code == 0, res.output
    assert "completion path" in res.output


def test_replay_with_prefect_publishes_tables_and_progress(
    tmp_path: Path, prefect_api: None
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    path = write_scenario(tmp_path, name="artsc")
    res = runner.invoke(app, ["replay", str(path)])
    assert res.exit_code == 0, res.output

    async def read() -> dict[str, Any]:
        async with get_client() as client:
            arts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(like_="maserve-replay-artsc"))
            )
            out: dict[str, Any] = {}
            for a in arts:
                out[a.key or ""] = a
            runs = {}
            for a in arts:
                if a.flow_run_id is not None and a.flow_run_id not in runs:
                    run = await client.read_flow_run(a.flow_run_id)
                    runs[a.flow_run_id] = (await client.read_flow(run.flow_id)).name
            out["__flows__"] = set(runs.values())
            return out

    arts = asyncio.run(read())
    # the replay's own flow run, and each arm's (its one-row summary table)
    assert arts["__flows__"] == {"maserve-replay", "maserve-replay-arm"}
    assert arts["maserve-replay-artsc-dag-b0"].type == "table"
    plot = arts["maserve-replay-artsc-plot-latency-cdf"]  # the plots, as markdown images
    assert plot.type == "markdown" and "data:image/png;base64," in str(plot.data)
    progress = arts["maserve-replay-artsc-progress"]
    assert progress.type == "progress" and float(progress.data) == 100.0
    for table in ("arms", "conformance", "completion-path", "stage-time", "attempts", "slo",
                  "goodput", "engine"):  # fmt: skip
        art = arts[f"maserve-replay-artsc-{table}"]
        assert art.type == "table"
    report = arts["maserve-replay-artsc-report"]
    assert report.type == "markdown" and "### completion path" in str(report.data)
