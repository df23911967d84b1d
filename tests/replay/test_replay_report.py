"""replay.report: a scenario's arm runs turned into metric tables and plots."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from maserve_prefect.replay.arms import ScenarioResult, run_scenario
from maserve_prefect.replay.metrics import scenario_metrics
from maserve_prefect.replay.report import (
    PLOT_FILES,
    metric_tables,
    report_scenario,
    write_plots,
)
from maserve_prefect.replay.scenario import parse_scenario
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
    Trace,
)

ENGINE_TABLES = {"engine", "replicas", "co-batching", "preemptions"}


def make_trace(num_roots: int = 6) -> Trace:
    """Roots of one class `chain`: model `a` (256 in, 32 out) -> model `b` (320 in, 8 out)."""
    gen = GenerationSettings(deployment="main")
    roots, ops = [], []
    for i in range(num_roots):
        r = f"r{i}"
        roots.append(RootRecord(root_id=r, workflow="chain", final_op_id=f"{r}/b"))
        ops += [
            OpRecord(op_id=f"{r}/a", root_id=r, kind=OpKind.MODEL, generation=gen,
                     num_input_tokens=256, num_output_tokens=32),
            OpRecord(op_id=f"{r}/b", root_id=r, kind=OpKind.MODEL, generation=gen,
                     num_input_tokens=320, num_output_tokens=8,
                     deps=(Dep(op_id=f"{r}/a", kind=EdgeKind.CONTROL),)),
        ]  # fmt: skip
    return Trace(manifest=Manifest(trace_id="chain"), roots=roots, ops=ops)


def run(**extra: Any) -> ScenarioResult:
    data: dict[str, Any] = {
        "name": "rr",
        "cohorts": [{"name": "t", "bundle": "unused"}],
        "lock": "length",
        "arrivals": {"kind": "poisson", "rate_per_s": 4.0, "seed": 1},
        "deadlines": {"classes": {"chain": 10.0}},
        "arms": [{"name": "dag"}],
    } | extra
    return run_scenario(
        parse_scenario(data), prefect=False, loaded={"t": (make_trace(), MemoryStore())}
    )


def test_a_burst_has_no_goodput_window_but_every_other_table() -> None:
    tables = report_scenario(run(arrivals={"kind": "burst"})).metric_tables
    assert tables["goodput"][0]["window_s"] is None
    assert tables["goodput"][0]["goodput_per_s"] is None
    assert tables["goodput"][0]["goodput_per_accel_s"] is None
    assert tables["slo"] == [
        {"arm": "dag", "block": 0, "class": "chain", "deadline_s": 10.0, "roots": 6, "met": 6,
         "attainment": 1.0}
    ]  # fmt: skip
    assert tables["completion path"][0]["roots"] == 6
    assert ENGINE_TABLES <= set(tables)


def test_a_window_with_an_end_measures_and_times_goodput_over_it() -> None:
    res = run(window={"start_s": 0.0, "end_s": 0.75})
    arm = res.results[0]
    offsets = {r: t - arm.run.start_s for r, t in arm.run.root_arrival_s.items()}
    inside = sorted(r for r, off in offsets.items() if off < 0.75)
    assert 0 < len(inside) < 6  # the seed puts some roots after the window
    m = scenario_metrics(res)[0]
    assert m.measured == inside
    assert m.goodput_window_s == pytest.approx(0.75)
    met = sum(lat.latency_s is not None and lat.latency_s <= 10.0 for lat in m.latencies)
    assert m.goodput_per_s == pytest.approx(met / 0.75)
    assert arm.summary.num_measured == len(inside)


def test_a_failed_root_is_a_miss_and_its_work_still_counts() -> None:
    res = run()
    arm = res.results[0]
    trace = arm.run.trace
    ops = [
        op.model_copy(update={"status": OpStatus.FAILED}) if op.op_id == "r2/b" else op
        for op in trace.ops
    ]
    arm.run = dataclasses.replace(arm.run, trace=trace.model_copy(update={"ops": ops}))
    tables = report_scenario(res).metric_tables
    by_status = {r["status"]: r for r in tables["attempts"]}
    assert (by_status["failed"]["roots"], by_status["completed"]["roots"]) == (1, 5)
    assert by_status["failed"]["output_tokens"] == 32 + 8  # both attempts' work is consumed
    assert tables["slo"][0]["roots"] == 6 and tables["slo"][0]["met"] == 5
    assert tables["completion path"][0]["roots"] == 5  # only completed roots have a path


def test_a_run_without_step_records_has_task_tables_only(tmp_path: Path) -> None:
    res = run()
    arm = res.results[0]
    arm.run = dataclasses.replace(arm.run, pool=None)  # what a real-engine run gives
    metrics = scenario_metrics(res)
    tables = metric_tables(metrics)
    assert not ENGINE_TABLES & set(tables)
    assert tables["goodput"][0]["accelerators"] is None
    assert tables["goodput"][0]["goodput_per_s"] is not None
    written = write_plots(res, metrics, tmp_path)
    assert [p.name for p in written] == [f for f in PLOT_FILES if f != "kv_occupancy.png"]
    assert all(p.stat().st_size > 0 for p in written)
