"""`maserve run` and `maserve trace export` through typer's CliRunner on the test Prefect API."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from maserve_prefect.cli import run_cmd, trace_cmd
from maserve_prefect.trace.bundle import import_bundle
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import Manifest
from maserve_prefect.trace.runs import RunStatus


def make_app() -> typer.Typer:
    app = typer.Typer()
    app.command("run")(run_cmd.run_cmd)
    app.add_typer(trace_cmd.app, name="trace")
    return app


runner = CliRunner()


def test_unreachable_openai_engine_fails_fast_naming_the_url(tmp_path: Path) -> None:
    result = runner.invoke(
        make_app(), ["run", "fork_join", "--engine", "openai:http://127.0.0.1:9/v1"]
    )
    assert result.exit_code == 1
    assert "http://127.0.0.1:9" in result.output and "start the server" in result.output


def test_unknown_workflow_and_engine_fail_clearly() -> None:
    result = runner.invoke(make_app(), ["run", "no_such_flow"])
    assert result.exit_code == 1
    assert "unknown workflow 'no_such_flow'" in result.output
    result = runner.invoke(make_app(), ["run", "fork_join", "--engine", "tgi"])
    assert result.exit_code == 1
    assert "expected 'sim' or 'openai:URL'" in result.output


def test_unique_trace_id_skips_ids_the_ledger_holds() -> None:
    ledger = Ledger("sqlite://", MemoryStore())
    assert run_cmd.unique_trace_id(ledger, "wf") == "wf"
    ledger.begin_run(Manifest(trace_id="wf"))
    ledger.begin_run(Manifest(trace_id="wf-2"))
    assert run_cmd.unique_trace_id(ledger, "wf") == "wf-3"


def test_list_names_the_templates() -> None:
    result = runner.invoke(make_app(), ["run", "--list"])
    assert result.exit_code == 0, result.output
    for name in ("spawn", "fork_join", "refinement_loop", "debate"):
        assert name in result.output


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_run_writes_bundle_waits_for_prefect_and_exports_the_same_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MASERVE_HOME", str(tmp_path / "home"))
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    out = tmp_path / "bundle"
    args = ["run", "fork_join", "--users", "2", "--seed", "4", "--out", str(out), "--ledger", db]
    result = runner.invoke(make_app(), [*args, "--wait", "90"])
    assert result.exit_code == 0, result.output
    assert "roots completed" in result.output and "2 / 2" in result.output
    assert "one to one" in result.output
    assert "not meaningful" in result.output  # simulator quality is flagged

    with Ledger(db, MemoryStore()) as ledger:
        (run,) = ledger.list_runs()
        tid = run.trace_id
        assert run.status is RunStatus.COMPLETED
        num_ops = len(ledger.load_trace(tid).ops)
    bundle = import_bundle(out, validate=False).trace
    assert len(bundle.ops) == num_ops > 0
    assert tid == "fork_join-math-s4-u2"

    # a second identical run gets a fresh trace id in the same ledger
    args[args.index(str(out))] = str(tmp_path / "bundle2")
    again = runner.invoke(make_app(), [*args, "--wait", "90"])
    assert again.exit_code == 0, again.output
    assert f"{tid}-2" in again.output

    exported = tmp_path / "from-prefect"
    result = runner.invoke(
        make_app(), ["trace", "export", "--run", tid, "--ledger", db, "--out", str(exported)]
    )
    assert result.exit_code == 0, result.output
    assert f"{num_ops} Prefect task runs" in result.output
    # the bundle assembled from Prefect + ledger is byte-identical to the one `run` wrote
    assert (exported / "trace.jsonl").read_bytes() == (out / "trace.jsonl").read_bytes()


def test_export_needs_one_of_flow_run_or_run() -> None:
    result = runner.invoke(make_app(), ["trace", "export"])
    assert result.exit_code == 1
    assert "exactly one of --flow-run" in result.output


def test_fleet_engine_needs_a_pool_file_with_reachable_endpoints(tmp_path: Path) -> None:
    result = runner.invoke(make_app(), ["run", "fork_join", "--engine", "fleet"])
    assert result.exit_code == 1 and "--engine fleet: give --pool FILE" in result.output
    result = runner.invoke(make_app(), ["run", "fork_join", "--route", "random"])
    assert result.exit_code == 1 and "--route 'random': use one of" in result.output
    result = runner.invoke(
        make_app(), ["run", "fork_join", "--engine", "fleet", "--api-key-env", "KEY"]
    )
    assert result.exit_code == 1 and "give each endpoint its own" in result.output
    nowhere = "http://127.0.0.1:9"
    pool = tmp_path / "fleet.yaml"
    pool.write_text(f"deployments: [{{name: main, model: Qwen3-8B, replicas: [{nowhere}]}}]\n")
    result = runner.invoke(
        make_app(), ["run", "fork_join", "--engine", "fleet", "--pool", str(pool)]
    )
    assert result.exit_code == 1
    assert f"pool file {pool}: deployment main: endpoint {nowhere} did not answer" in " ".join(
        result.output.split()
    )
