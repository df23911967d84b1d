"""Replaying a Mooncake file against a server on its timestamps: probes once, before the arms;
request-level and server-side latency per arm; the schedule lag in the audit; the one-line CLI."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import typer
from openai_stub import StubConfig, serve
from typer.testing import CliRunner

from maserve_prefect.cli import replay_cmd
from maserve_prefect.errors import TraceImportError
from maserve_prefect.replay.arms import run_scenario
from maserve_prefect.replay.conformance import audit, failure_reason
from maserve_prefect.replay.report import report_scenario
from maserve_prefect.replay.scenario import Arm, load_scenario, mooncake_scenario

SHIPPED = Path(__file__).parents[2] / "deployments/suites/scenarios/mooncake_replay.yaml"
ROWS = [
    {"timestamp": 0, "input_length": 40, "output_length": 3, "hash_ids": [1]},
    {"timestamp": 30, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]},
    {"timestamp": 60, "input_length": 20, "output_length": 4, "hash_ids": [3]},
]


def _file(tmp_path: Path, rows: list[dict[str, object]] = ROWS) -> Path:
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_probes_run_once_before_any_arm_and_each_arm_is_measured_on_both_sides(
    tmp_path: Path,
) -> None:
    with serve(StubConfig()) as stub:
        sc = mooncake_scenario(_file(tmp_path), f"openai:{stub.url}", timeout_s=60)
        sc = sc.model_copy(update={"arms": (*sc.arms, Arm(name="again"))})
        rep = report_scenario(run_scenario(sc, prefect=False))
        posts = [body for path, body in stub.received if path.endswith("completions")]
        resets = [path for path, _ in stub.received if path == "/reset_prefix_cache"]
    first_stream = next(i for i, b in enumerate(posts) if b.get("stream"))
    probes = [b for b in posts if not b.get("stream")]
    assert probes and all(not b.get("stream") for b in posts[:first_stream])
    assert len(probes) == first_stream  # one discovery's probes, none between the arms
    assert len(posts) - len(probes) == 2 * len(ROWS) and len(resets) == 2  # a drain per arm
    rows = rep.metric_tables["request latency"]
    for arm in ("schedule", "again"):
        mine = {(r["source"], r["metric"]): r for r in rows if r["arm"] == arm}
        assert {m for s, m in mine if s == "client"} == {"ttft", "tpot", "e2e"}
        assert mine[("client", "e2e")]["requests"] == len(ROWS)
        # the server counted this arm's requests only: no probe reached it during the arm
        assert mine[("server /metrics", "ttft")]["requests"] == len(ROWS)
        assert mine[("client - server", "ttft")]["mean_ms"] is not None
    for c in rep.conformance:
        assert c.num_scheduled == len(ROWS) and c.schedule_p99_ms is not None
    assert all(r.server is not None for r in rep.result.results)


def test_the_audit_fails_a_run_whose_requests_went_out_late_against_the_schedule(
    tmp_path: Path,
) -> None:
    with serve(StubConfig()) as stub:
        sc = mooncake_scenario(_file(tmp_path), f"openai:{stub.url}", timeout_s=60)
        run = run_scenario(sc, prefect=False).results[0].run
    ok = audit(run)
    late = dataclasses.replace(
        run, schedule_lag_s={k: (due, due + 0.005) for k, (due, _) in run.schedule_lag_s.items()}
    )
    bad = audit(late)
    assert bad.work_ok and not bad.schedule_ok and not bad.passed
    assert bad.schedule_p99_ms == pytest.approx(5.0)
    assert "late arrivals (schedule lag p99 5.000 ms > 1 ms)" in failure_reason(bad)
    assert bad.row()["schedule_lag_p99_ms"] == pytest.approx(5.0)
    assert ok.schedule_p99_ms is not None and ok.num_scheduled == len(ROWS)


def test_a_row_that_does_not_import_names_the_file_and_line(tmp_path: Path) -> None:
    path = _file(tmp_path, [*ROWS, {"timestamp": 90, "input_length": 10}])
    sc = mooncake_scenario(path)
    with pytest.raises(TraceImportError, match=r"requests\.jsonl:4: missing_field"):
        run_scenario(sc, prefect=False)


def test_the_shipped_scenario_is_the_one_line_cli_on_its_file() -> None:
    shipped = load_scenario(SHIPPED)
    assert shipped.cohorts[0].mooncake is not None
    line = mooncake_scenario(shipped.path(shipped.cohorts[0].mooncake))
    keys = ("arrivals", "lock", "initial_state", "arms")
    assert {k: getattr(shipped, k) for k in keys} == {k: getattr(line, k) for k in keys}


app = typer.Typer()
app.command("replay")(replay_cmd.replay_cmd)


@app.callback()
def _group() -> None:
    """Keep `replay` a named subcommand."""


def test_cli_replays_a_mooncake_file_and_prints_the_request_table(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["replay", "--mooncake", str(_file(tmp_path)), "--no-prefect"])
    assert res.exit_code == 0, res.output
    assert "request latency" in res.output and "ttft" in res.output
    none = runner.invoke(app, ["replay", "--no-prefect"])
    assert none.exit_code == 1 and "--mooncake" in none.output
