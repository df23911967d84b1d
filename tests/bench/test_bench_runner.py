"""Running a suite of any kind: the work, its tables, progress, and the Prefect flow run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from bench_factories import write_hear_suite, write_pool_suite, write_suite

from maserve_prefect.bench.flow import run_suite
from maserve_prefect.bench.pool.results import PoolSuiteResult
from maserve_prefect.bench.replay.suite import ReplaySuiteResult
from maserve_prefect.bench.result import SuiteResult
from maserve_prefect.errors import ConfigError
from maserve_prefect.replay.report import report_scenario


def replay_detail(res: SuiteResult) -> ReplaySuiteResult:
    assert isinstance(res.detail, ReplaySuiteResult)
    return res.detail


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
    detail = replay_detail(res)
    assert [(r["arm"], r["block"]) for r in detail.arm_rows()] == [
        ("dag", 0), ("dag", 1), ("flat", 0), ("flat", 1)
    ]  # fmt: skip
    conf = detail.conformance_rows()
    assert len(conf) == 4 and all(r["token_mismatches"] == 0 for r in conf)
    assert {r["rule"]: r["non_causal"] for r in conf} == {"dag": False, "flat": True}
    assert all(r["early_releases"] == 0 for r in conf if r["rule"] == "dag")
    assert detail.findings == [{"num_scenarios": 1}]
    assert list(res.tables()) == [
        "arms", "conformance", "request latency", "completion path", "stage time", "attempts",
        "slo", "goodput", "engine", "replicas", "co-batching", "preemptions", "findings",
    ]  # fmt: skip
    assert res.tables()["arms"] == detail.arm_rows()
    data = res.to_json()
    assert (data["kind"], data["scale"], data["flow_run_id"]) == ("replay", "full", None)
    assert data["work_ok"] is True and data["tables"]["findings"] == [{"num_scenarios": 1}]


def test_suite_metric_tables_match_the_replay_report(tmp_path: Path) -> None:
    res = run_suite(write_suite(tmp_path), "demo", prefect=False)
    tables = res.tables()
    rep = report_scenario(replay_detail(res).results["toy"])
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
    assert json.loads(json.dumps(res.to_json()))["tables"]["goodput"] == tables["goodput"]


def test_a_bad_scale_fails_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown scale 'big'"):
        run_suite(write_suite(tmp_path), "big", prefect=False)


def test_run_suite_is_one_flow_run_with_artifacts(tmp_path: Path, prefect_api: None) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    res = run_suite(write_suite(tmp_path, name="flowsuite"), "demo")
    assert res.flow_run_id is not None and replay_detail(res).work_ok  # lateness: wall clock
    assert len(res.tables()["arms"]) == 2

    async def read() -> tuple[str, str, set[str], list[str]]:
        async with get_client() as client:
            run = await client.read_flow_run(res.flow_run_id)  # type: ignore[arg-type]
            flow = await client.read_flow(run.flow_id)
            arts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    key=ArtifactFilterKey(like_="maserve-suite-flowsuite")
                )
            )
            return flow.name, run.state_type.value, {a.key for a in arts if a.key}, run.tags

    name, state, keys, tags = asyncio.run(read())
    assert (name, state) == ("maserve-suite", "COMPLETED")
    assert "suite:flowsuite" in tags  # the UI filters a suite's runs by it
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


def test_a_hear_suite_runs_every_arm_on_one_workload(tmp_path: Path) -> None:
    seen: list[tuple[int, int, str]] = []
    out = tmp_path / "out"
    res = run_suite(
        write_hear_suite(tmp_path),
        "demo",
        prefect=False,
        progress=lambda done, total, label: seen.append((done, total, label)),
        out=out,
    )
    assert seen == [(1, 2, "fcfs"), (2, 2, "cache_aware")]  # one unit per arm
    arms = res.tables()["arms"]
    assert [r["policy"] for r in arms] == ["fcfs", "cache_aware"]
    assert len({r["workload_sha256"] for r in arms}) == 1
    assert all(r["num_completed"] == r["num_turns"] > 0 for r in arms)
    assert res.tables()["meta"][0]["num_sessions"] == 3  # the demo scale's override
    data = json.loads((out / "toy-hear.json").read_text())
    assert (data["kind"], data["experiment"], data["scale"]) == ("hear", "scbench", "demo")
    assert data["tables"]["arms"][0]["makespan_s"] == arms[0]["makespan_s"]
    md = (out / "toy-hear.md").read_text()
    assert md.startswith("## suite toy-hear (demo)") and "### Policy arms" in md
    assert "workload_sha256" not in md.split("### Policy arms")[1].split("###")[0]  # not shown
    assert [p.name for p in res.files] == [
        "hear_scbench_demo_workload.jsonl", "toy-hear.json", "toy-hear.md"
    ]  # fmt: skip


@pytest.fixture(scope="module")
def pool_run(
    tmp_path_factory: pytest.TempPathFactory, prefect_api: None, shared_data: Path
) -> tuple[SuiteResult, list[tuple[int, int, str]]]:
    folder = tmp_path_factory.mktemp("pool")
    seen: list[tuple[int, int, str]] = []
    res = run_suite(
        write_pool_suite(folder, shared_data / "profiles"),
        "tiny",
        prefect=False,
        progress=lambda done, total, label: seen.append((done, total, label)),
    )
    return res, seen


def test_a_pool_suite_runs_every_pattern_run_and_arm(
    pool_run: tuple[SuiteResult, list[tuple[int, int, str]]],
) -> None:
    res, seen = pool_run
    assert seen == [(1, 2, "burst/joint/run0"), (2, 2, "burst/pool-fcfs/run0")]
    assert isinstance(res.detail, PoolSuiteResult)
    assert [(r["arrivals"], r["arm"], r["sessions_done"]) for r in res.tables()["arms"]] == [
        ("burst", "joint", 1.0), ("burst", "pool-fcfs", 1.0)
    ]  # fmt: skip
    assert "predictors" not in res.tables()  # the tiny scale does not score them
    goals = {(g["ratio"], g["metric"]) for g in res.tables()["goals"]}
    assert ("joint/fcfs", "makespan") in goals and ("joint/lower bound", "makespan") in goals
    data = res.to_json()
    assert data["kind"] == "pool" and data["scale_config"]["sessions_per_workflow"] == 1
    assert [r["arm"] for r in data["per_run"]] == ["joint", "pool-fcfs"]


def test_a_bad_scale_of_any_kind_fails_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown scale 'medium'; use one of demo, full"):
        run_suite(write_hear_suite(tmp_path), "medium", prefect=False)
    with pytest.raises(ConfigError, match="unknown scale 'demo'; use one of tiny"):
        run_suite(write_pool_suite(tmp_path, tmp_path), "demo", prefect=False)


def test_a_hear_suite_is_one_flow_run_with_artifacts(tmp_path: Path, prefect_api: None) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    seen: list[float] = []
    res = run_suite(write_hear_suite(tmp_path, name="flowhear"), "demo",
                    progress=lambda done, total, label: seen.append(done / total))  # fmt: skip
    assert res.flow_run_id is not None and seen == [0.5, 1.0]

    async def read() -> tuple[str, dict[str, str]]:
        async with get_client() as client:
            run = await client.read_flow_run(res.flow_run_id)  # type: ignore[arg-type]
            flow = await client.read_flow(run.flow_id)
            arts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    key=ArtifactFilterKey(like_="maserve-suite-flowhear")
                )
            )
            return flow.name, {a.key: a.type or "" for a in arts if a.key}

    name, arts = asyncio.run(read())
    assert name == "maserve-suite"
    assert {k: arts.get(k) for k in (
        "maserve-suite-flowhear-arms", "maserve-suite-flowhear-headline",
        "maserve-suite-flowhear-overhead", "maserve-suite-flowhear-report",
        "maserve-suite-flowhear-progress",
    )} == {
        "maserve-suite-flowhear-arms": "table", "maserve-suite-flowhear-headline": "table",
        "maserve-suite-flowhear-overhead": "table", "maserve-suite-flowhear-report": "markdown",
        "maserve-suite-flowhear-progress": "progress",
    }  # fmt: skip
