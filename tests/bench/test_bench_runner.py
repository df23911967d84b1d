"""Running a suite: every arm of every scenario, audits, findings, progress, the Prefect flow run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from bench_factories import write_suite

from maserve_prefect.bench.runner import run_suite
from maserve_prefect.errors import ConfigError
from maserve_prefect.replay.report import report_scenario


def test_run_suite_without_prefect_runs_every_arm_and_audits_it(tmp_path: Path) -> None:
    seen: list[tuple[int, int, str]] = []
    res = run_suite(
        write_suite(tmp_path, analysis="bench_factories.count_rows"),
        "full",
        prefect=False,
        progress=lambda done, total, label: seen.append((done, total, label)),
    )
    # full scale: 2 blocks x 2 arms; odd blocks run the arms in reverse order
    assert seen == [(1, 4, "toy/dag/b0"), (2, 4, "toy/flat/b0"), (3, 4, "toy/flat/b1"),
                    (4, 4, "toy/dag/b1")]  # fmt: skip
    assert [(r["arm"], r["block"]) for r in res.arm_rows()] == [
        ("dag", 0), ("dag", 1), ("flat", 0), ("flat", 1)
    ]  # fmt: skip
    conf = res.conformance_rows()
    assert len(conf) == 4 and all(r["token_mismatches"] == 0 for r in conf)
    assert {r["rule"]: r["non_causal"] for r in conf} == {"dag": False, "flat": True}
    assert all(r["early_releases"] == 0 for r in conf if r["rule"] == "dag")
    assert res.findings == [{"num_scenarios": 1}]
    assert list(res.tables()) == [
        "arms", "conformance", "completion path", "stage time", "attempts", "slo", "goodput",
        "engine", "replicas", "co-batching", "preemptions", "findings",
    ]  # fmt: skip
    assert res.to_json()["scale"] == "full" and res.flow_run_id is None


def test_suite_metric_tables_match_the_replay_report(tmp_path: Path) -> None:
    res = run_suite(write_suite(tmp_path), "demo", prefect=False)
    tables = res.tables()
    rep = report_scenario(res.results["toy"])
    for name, rows in rep.metric_tables.items():
        assert tables[name] == [{"scenario": "toy"} | r for r in rows], name
    # every measured root of both arms completed: its work is counted once per arm run
    done = [r for r in tables["attempts"] if r["status"] == "completed"]
    assert [(r["arm"], r["roots"], r["output_tokens"]) for r in done] == [
        ("dag", 2, 16), ("flat", 2, 16)
    ]  # fmt: skip
    # the path shares of each arm run add up to one (the ledger reconciles)
    for row in tables["completion path"]:
        shares = ("boundary_gap", "pre_submission", "backend_wait", "scheduled_residence")
        assert sum(row[k] for k in shares) == pytest.approx(1.0)
    assert [r["arm"] for r in tables["engine"]] == ["dag", "flat"]
    assert json.loads(json.dumps(res.to_json()))["goodput"] == tables["goodput"]


def test_a_bad_scale_fails_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown scale 'big'"):
        run_suite(write_suite(tmp_path), "big", prefect=False)


def test_run_suite_is_one_flow_run_with_artifacts(tmp_path: Path, prefect_api: None) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    res = run_suite(write_suite(tmp_path, name="flowsuite"), "demo")
    assert res.flow_run_id is not None and res.work_ok  # lateness is a wall-clock figure
    assert len(res.arm_rows()) == 2

    async def read() -> tuple[str, str, set[str]]:
        async with get_client() as client:
            run = await client.read_flow_run(res.flow_run_id)  # type: ignore[arg-type]
            flow = await client.read_flow(run.flow_id)
            arts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    key=ArtifactFilterKey(like_="maserve-suite-flowsuite")
                )
            )
            return flow.name, run.state_type.value, {a.key for a in arts if a.key}

    name, state, keys = asyncio.run(read())
    assert (name, state) == ("maserve-suite", "COMPLETED")
    assert {"maserve-suite-flowsuite-arms", "maserve-suite-flowsuite-conformance"} <= keys
    assert {f"maserve-suite-flowsuite-{t}" for t in (
        "completion-path", "stage-time", "attempts", "slo", "goodput", "engine", "replicas"
    )} <= keys  # fmt: skip


def test_suite_progress_artifact_reaches_100_percent(
    tmp_path: Path, prefect_api: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    import maserve_prefect.metrics.report as report

    seen: list[float] = []
    update = report.Progress.update

    def record(self: report.Progress, percent: float) -> None:
        seen.append(percent)
        update(self, percent)

    monkeypatch.setattr(report.Progress, "update", record)
    res = run_suite(write_suite(tmp_path, name="progsuite"), "full")
    assert seen == [25.0, 50.0, 75.0, 100.0]  # 2 blocks x 2 arms at full scale

    async def read() -> list[tuple[str, object, str | None]]:
        async with get_client() as client:
            arts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    key=ArtifactFilterKey(any_=["maserve-suite-progsuite-progress"])
                )
            )
            return [(a.type or "", a.data, str(a.flow_run_id)) for a in arts]

    arts = asyncio.run(read())
    assert len(arts) == 1
    kind, data, flow_run_id = arts[0]
    assert kind == "progress" and float(data) == 100.0  # type: ignore[arg-type]
    assert flow_run_id == res.flow_run_id
