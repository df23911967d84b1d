"""`maserve bench run` and the deployments `maserve bench serve` builds."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import typer
from bench_factories import write_suite
from typer.testing import CliRunner

from maserve_prefect.bench.serve import check_servable, scheduled_suites, suite_deployment
from maserve_prefect.cli import bench_cmd

app = typer.Typer()
app.add_typer(bench_cmd.app, name="bench")
runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "deployments" / "suites"


def test_bench_run_prints_tables_and_writes_json(tmp_path: Path) -> None:
    suite = write_suite(tmp_path, analysis="bench_factories.count_rows")
    out = tmp_path / "out"
    res = runner.invoke(app, ["bench", "run", str(suite), "--no-prefect", "--out", str(out)])
    assert res.exit_code == 0, res.output
    # The flat arm is flagged as a non-causal reference (the table may wrap the label).
    assert "conformance audit" in res.output and "flat (non-causal" in res.output
    assert "findings" in res.output
    data = json.loads((out / "toy-suite.json").read_text())
    assert data["suite"] == "toy-suite" and data["scale"] == "demo" and data["work_ok"] is True
    assert len(data["arms"]) == 2 and len(data["conformance"]) == 2
    assert {(r["arm"], r["non_causal"]) for r in data["conformance"]} == {
        ("dag", False),
        ("flat", True),
    }
    assert data["findings"] == [{"num_scenarios": 1}]


def test_bench_run_names_a_bad_suite_field(tmp_path: Path) -> None:
    suite = write_suite(tmp_path, scales={"demo": {"nodes": 1}})
    res = runner.invoke(app, ["bench", "run", str(suite), "--no-prefect"])
    assert res.exit_code == 1
    assert "unknown override 'nodes'" in res.output


def test_bench_serve_refuses_a_folder_without_scheduled_suites(tmp_path: Path) -> None:
    write_suite(tmp_path)
    res = runner.invoke(
        app, ["bench", "serve", "--suites", str(tmp_path)], env={"PREFECT_API_URL": ""}
    )
    assert res.exit_code == 1
    assert "no suite in" in res.output and "schedule" in res.output


def test_scheduled_suites_become_deployments_of_the_suite_flow(tmp_path: Path) -> None:
    write_suite(tmp_path, name="a", schedule={"interval_s": 5})
    write_suite(tmp_path, name="b", schedule={"cron": "0 3 * * *"})
    write_suite(tmp_path, name="c")
    deps = [suite_deployment(p, s, "full") for p, s in scheduled_suites(tmp_path)]
    assert [d.name for d in deps] == ["a", "b"]
    assert {d.entrypoint for d in deps} == {"maserve_prefect.bench.flow.maserve_suite"}
    assert deps[0].parameters == {"path": str((tmp_path / "a.yaml").resolve()), "scale": "full"}
    interval = deps[0].schedules[0].schedule
    cron = deps[1].schedules[0].schedule
    assert getattr(interval, "interval", None) == dt.timedelta(seconds=5)
    assert getattr(cron, "cron", None) == "0 3 * * *"


def test_the_shipped_suites_folder_is_servable() -> None:
    """`maserve bench serve` (default folder) and `deployments/serve.py` find every finding
    suite scheduled: daily crons, staggered so one runs at a time, at demo scale by default."""
    assert (REPO / bench_cmd.DEFAULT_SUITES).resolve() == SHIPPED
    suites = check_servable(SHIPPED)
    assert [s.name for _, s in suites] == [
        "finding-barrier",
        "finding-kv-budget",
        "finding-rate-sweep",
        "finding-request-limit",
    ]
    deps = [suite_deployment(p, s) for p, s in suites]
    crons = [getattr(d.schedules[0].schedule, "cron", None) for d in deps]
    assert all(c is not None and c.endswith(" * * *") for c in crons)  # daily
    assert len(set(crons)) == len(crons)
    assert {d.parameters["scale"] for d in deps} == {"demo"}
