"""`maserve bench run` on every kind of suite, and the deployments `maserve bench serve` builds."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
import typer
from bench_factories import write_hear_suite, write_pool_suite, write_suite
from typer.testing import CliRunner

from maserve_prefect.bench.serve import (
    check_servable,
    scheduled_suites,
    serving_line,
    suite_deployment,
)
from maserve_prefect.cli import bench_cmd
from maserve_prefect.errors import ConfigError

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
    assert data["kind"] == "replay" and data["flow_run_id"] is None
    tables = data["tables"]
    assert len(tables["arms"]) == 2 and len(tables["conformance"]) == 2
    assert {(r["arm"], r["non_causal"]) for r in tables["conformance"]} == {
        ("dag", False),
        ("flat", True),
    }
    assert tables["findings"] == [{"num_scenarios": 1}]
    assert "### conformance" in (out / "toy-suite.md").read_text()


def test_bench_run_no_metrics_leaves_out_the_metric_tables(tmp_path: Path) -> None:
    suite = write_suite(tmp_path)
    res = runner.invoke(app, ["bench", "run", str(suite), "--no-prefect", "--no-metrics"])
    assert res.exit_code == 0, res.output
    assert "conformance audit" in res.output and "goodput" not in res.output


def test_bench_run_a_hear_suite_without_prefect(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = runner.invoke(
        app, ["bench", "run", str(write_hear_suite(tmp_path)), "--no-prefect", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert "HEAR SCBench (demo): 3 sessions" in res.output
    assert "Policy arms" in res.output and "Control-plane overhead" in res.output
    data = json.loads((out / "toy-hear.json").read_text())
    assert (data["kind"], data["experiment"], data["flow_run_id"]) == ("hear", "scbench", None)
    assert [r["policy"] for r in data["tables"]["arms"]] == ["fcfs", "cache_aware"]
    assert (out / "toy-hear.md").is_file() and (out / "hear_scbench_demo_workload.jsonl").is_file()
    assert f"wrote {out / 'toy-hear.json'}" in res.output.replace("\n", "")


def test_bench_run_a_hear_suite_with_prefect(tmp_path: Path, prefect_api: None) -> None:
    out = tmp_path / "out"
    res = runner.invoke(
        app, ["bench", "run", str(write_hear_suite(tmp_path, name="cli-hear")), "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    data = json.loads((out / "cli-hear.json").read_text())
    assert data["flow_run_id"] is not None and data["kind"] == "hear"


def test_bench_run_a_pool_suite_without_a_suite_flow_run(
    tmp_path: Path, prefect_api: None, shared_data: Path
) -> None:
    """`--no-prefect`: no `maserve-suite` flow run (the native traces the work is made of are
    still recorded through Prefect, or read from the cache)."""
    suite = write_pool_suite(tmp_path, shared_data / "profiles")
    out = tmp_path / "out"
    args = ["bench", "run", str(suite), "--scale", "tiny", "--no-prefect", "--out", str(out)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "Per arrival pattern and arm" in res.output and "Goals" in res.output
    data = json.loads((out / "toy-pool.json").read_text())
    assert (data["kind"], data["scale"], data["flow_run_id"]) == ("pool", "tiny", None)
    assert [r["arm"] for r in data["tables"]["arms"]] == ["joint", "pool-fcfs"]
    assert "## suite toy-pool (tiny)" in (out / "toy-pool.md").read_text()


def test_bench_run_refuses_a_scale_the_suite_lacks(tmp_path: Path) -> None:
    suite = write_pool_suite(tmp_path, tmp_path)
    res = runner.invoke(app, ["bench", "run", str(suite), "--no-prefect"])  # default: demo
    assert res.exit_code == 1
    assert "unknown scale 'demo'; use one of tiny" in res.output


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


def test_scheduled_suites_of_any_kind_become_deployments(tmp_path: Path) -> None:
    write_hear_suite(tmp_path, name="h", schedule={"interval_s": 30})
    write_pool_suite(tmp_path, tmp_path, name="p", schedule={"cron": "0 5 * * *"})
    write_suite(tmp_path, name="r")  # not scheduled
    suites = scheduled_suites(tmp_path)
    assert [(p.name, s.kind) for p, s in suites] == [("h.yaml", "hear"), ("p.yaml", "pool")]
    with pytest.raises(ConfigError, match="suite p: unknown scale 'demo'"):
        check_servable(tmp_path, "demo")  # the pool suite only has `tiny`
    (tmp_path / "p.yaml").unlink()
    (dep,) = [suite_deployment(p, s, "full") for p, s in check_servable(tmp_path, "full")]
    assert dep.name == "h" and dep.entrypoint == "maserve_prefect.bench.flow.maserve_suite"
    assert dep.parameters == {"path": str((tmp_path / "h.yaml").resolve()), "scale": "full"}
    assert getattr(dep.schedules[0].schedule, "interval", None) == dt.timedelta(seconds=30)
    assert dep.description == "a tiny HEAR suite"


def test_a_served_suite_can_fan_out_on_dask(tmp_path: Path) -> None:
    write_suite(tmp_path, name="a", schedule={"interval_s": 5})
    ((path, suite),) = scheduled_suites(tmp_path)
    dep = suite_deployment(path, suite, "demo", workers=2)
    assert dep.parameters == {"path": str(path), "scale": "demo", "workers": 2}
    dep = suite_deployment(path, suite, "demo", dask_address="tcp://10.0.0.5:8786")
    assert dep.parameters["dask_address"] == "tcp://10.0.0.5:8786"


def test_bench_run_refuses_a_bad_worker_count_or_address_in_one_line(tmp_path: Path) -> None:
    suite = write_suite(tmp_path)
    res = runner.invoke(app, ["bench", "run", str(suite), "--no-prefect", "--workers", "0"])
    assert res.exit_code != 0 and "--workers" in res.output
    res = runner.invoke(
        app, ["bench", "run", str(suite), "--no-prefect", "--dask-address", "somehost"]
    )
    assert res.exit_code == 1
    assert "--dask-address 'somehost': expected a scheduler address such as tcp://HOST:8786" in (
        res.output
    )
    assert "Traceback" not in res.output


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
    """`maserve bench serve` (default folder) and `deployments/serve.py` serve a suite of every
    kind (the four finding suites, the HEAR and pool suites): daily crons, staggered so one runs
    at a time, at demo scale by default; the startup line names each with its kind and time."""
    assert (REPO / bench_cmd.DEFAULT_SUITES).resolve() == SHIPPED
    suites = check_servable(SHIPPED)
    assert [s.name for _, s in suites] == [
        "finding-barrier",
        "finding-kv-budget",
        "finding-rate-sweep",
        "finding-request-limit",
        "hear-mooncake",
        "hear-role-modes",
        "hear-scbench",
        "pool-hetero",
    ]
    assert {s.kind for _, s in suites} == {"replay", "hear", "pool"}
    deps = [suite_deployment(p, s) for p, s in suites]
    crons = [getattr(d.schedules[0].schedule, "cron", None) for d in deps]
    assert all(c is not None and c.endswith(" * * *") for c in crons)  # daily
    assert len(set(crons)) == len(crons)
    line = serving_line(SHIPPED)
    assert line.startswith("serving 8 suite(s) at scale demo: finding-barrier (replay, daily 03:00")
    assert "pool-hetero (pool, daily 04:10 UTC)" in line and "hear-scbench (hear, daily" in line
    assert "not served (no `schedule`): conformance-replay-native" in line
    assert {d.parameters["scale"] for d in deps} == {"demo"}
