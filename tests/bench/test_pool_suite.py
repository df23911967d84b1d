"""The heterogeneous-pool suite at demo scale: complete, above the lower bound, deterministic."""

from __future__ import annotations

import dataclasses
import doctest
import json
from pathlib import Path

import pytest

from maserve_prefect.bench.pool import suite as pool_suite
from maserve_prefect.bench.pool.results import PoolSuiteResult
from maserve_prefect.bench.pool.suite import run_pool_suite
from maserve_prefect.bench.pool.suite_file import PoolSuite
from maserve_prefect.bench.pool.tables import pool_report, suite_tables
from maserve_prefect.bench.result import SuiteResult
from maserve_prefect.bench.suite import load_suite
from maserve_prefect.errors import ConfigError

SUITE = Path(__file__).resolve().parents[2] / "deployments" / "suites" / "pool_hetero.yaml"


def load_pool_suite(path: Path) -> PoolSuite:
    suite = load_suite(path)
    assert isinstance(suite, PoolSuite)
    return suite


@pytest.fixture(scope="module")
def twice(prefect_api: None, shared_data: Path) -> tuple[PoolSuiteResult, PoolSuiteResult]:
    """The demo, and the demo again without its Oracle: the Oracle's search is most of the
    demo's time, and its own determinism is `tests/pool/test_oracle.py`'s (same search, same
    schedule); every arm and table beside it must come out identical."""
    suite = load_pool_suite(SUITE)
    demo = suite.scale("demo")
    again = suite.model_copy(
        update={
            "scales": {**suite.scales, "demo": demo.model_copy(update={"oracle_evaluations": 0})}
        }
    )
    return run_pool_suite(suite, "demo"), run_pool_suite(again, "demo")


def test_every_arm_completes_every_session_above_the_lower_bound(
    twice: tuple[PoolSuiteResult, PoolSuiteResult],
) -> None:
    res = twice[0]
    scale = res.suite.scale("demo")
    sessions = scale.sessions_per_workflow * len(res.suite.workflows)
    assert sessions == 12 and len(scale.device_names()) == 2
    assert {r.arm for r in res.runs} == set(scale.arms or ())
    for r in res.runs:
        assert len(r.latency_s) == sessions, r.arm
        assert r.summary["makespan_s"] >= res.lower_bounds[(r.pattern, r.run)] > 0
        assert r.summary["gpu_s_total"] > r.summary["gpu_s_generation"] > 0
    for row in suite_tables(res)["arms"]:
        assert row["sessions_done"] == sessions
    paths = suite_tables(res)["model_paths"]
    for arm in scale.arms or ():
        assert sum(p["completed_per_run"] for p in paths if p["arm"] == arm) == sessions


def test_the_oracle_is_reported_beside_every_arm_and_no_arm_beats_it(
    twice: tuple[PoolSuiteResult, PoolSuiteResult],
) -> None:
    res = twice[0]
    rows = {r["arm"]: r for r in suite_tables(res)["oracle"]}
    oracle = rows.pop("oracle")
    assert oracle["vs_lower_bound"] >= 1.0 and "simulator runs" in oracle["note"]
    assert set(rows) == set(res.suite.scale("demo").arms or ())
    for arm, row in rows.items():
        assert row["makespan_vs_oracle"] >= 1.0, arm
    goals = {g["ratio"]: g for g in suite_tables(res)["goals"]}
    assert goals["joint/oracle"]["achieved"] == rows["joint"]["makespan_vs_oracle"]
    assert goals["oracle/lower bound"]["achieved"] == oracle["vs_lower_bound"]
    # where the Oracle does not run, the table says why instead
    skipped = dataclasses.replace(res, oracles={}, oracle_skipped={("burst", 0): "too big"})
    assert suite_tables(skipped)["oracle"] == [
        {"arrivals": "burst", "arm": "oracle", "note": "skipped: too big"}
    ]


def test_two_runs_give_identical_tables(twice: tuple[PoolSuiteResult, PoolSuiteResult]) -> None:
    first, second = twice
    assert not second.oracles and first.oracles  # the second run left its Oracle out
    tables = {k: v for k, v in suite_tables(first).items() if k not in ("oracle", "goals")}
    again = {k: v for k, v in suite_tables(second).items() if k not in ("oracle", "goals")}
    assert tables == again
    goals = [g for g in suite_tables(first)["goals"] if "oracle" not in str(g["ratio"])]
    assert goals == [g for g in suite_tables(second)["goals"] if "oracle" not in str(g["ratio"])]
    assert [r.summary for r in first.runs] == [r.summary for r in second.runs]
    assert first.lower_bounds == second.lower_bounds


def test_tables_carry_the_goals_beside_what_was_achieved(
    twice: tuple[PoolSuiteResult, PoolSuiteResult], tmp_path: Path
) -> None:
    res = twice[0]
    tables = suite_tables(res)
    assert {"arms", "goals", "model_paths", "ablations", "model_availability", "predictors"} <= set(
        tables
    )
    goals = {(g["ratio"], g["metric"]): g for g in tables["goals"]}
    assert goals[("joint/parrot", "makespan")]["goal"] == "≤ 0.60×"
    assert goals[("joint/kairos", "p95")]["goal"] == "≤ 0.72×"
    assert goals[("joint/lower bound", "makespan")]["goal"] == "≤ 1.15×"
    assert goals[("joint/fcfs", "makespan")]["met"] == "–"  # FCFS is shown, not a goal
    for g in goals.values():
        assert g["achieved"] > 0 and g["met"] in ("yes", "no", "–")
    lb = goals[("joint/lower bound", "makespan")]
    assert lb["achieved"] >= 1.0 and lb["met"] == ("yes" if lb["achieved"] <= 1.15 else "no")
    avail = tables["model_availability"][0]
    assert {"wait_ongoing_load_s_per_session", "wait_load_cannot_start_s_per_session"} <= set(avail)
    assert {p["predictor"] for p in tables["predictors"]} == {
        "formula (roofline)",
        "scalar GBDT",
        "learned graph",
        "message passing (GNN)",
    }
    js, md = SuiteResult(res.suite, res.scale, pool_report(res), detail=res).write(tmp_path)
    assert (js.name, md.name) == ("pool-hetero.json", "pool-hetero.md")
    doc = json.loads(js.read_text())
    assert doc["tables"]["goals"][0]["goal"].startswith("≤")
    assert doc["tables"]["goals"] == tables["goals"]
    assert "### Goals: headline vs baselines" in md.read_text() and "≤ 0.60×" in md.read_text()


def test_suite_file_errors_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    text = SUITE.read_text().replace("arms: [joint, joint-no-fusion,", "arms: [joint, nope,")
    bad.write_text(text)
    with pytest.raises(ConfigError, match=r"scales\.demo\.arms.*'nope'"):
        load_pool_suite(bad)
    with pytest.raises(ConfigError, match="unknown scale 'huge'"):
        load_pool_suite(SUITE).scale("huge")


def test_replica_sizing_defaults_to_one_vllm_replica_per_gpu(tmp_path: Path) -> None:
    suite = load_pool_suite(SUITE)
    demo = suite.scale("demo")
    opts = suite.arms["joint"].options(suite.sizing(demo))
    assert (opts.gpu_memory_utilization, opts.kv_cache_bytes) == (0.9, None)
    colo = tmp_path / "colo.yaml"
    colo.write_text(
        SUITE.read_text().replace(
            "replicas:\n  gpu_memory_utilization: 0.9",
            "replicas: {colocate: true, kv_cache_gib: 1.5}",
        )
    )
    colocated = load_pool_suite(colo)
    opts = colocated.arms["joint-no-fusion"].options(colocated.sizing(demo))
    assert opts.kv_cache_bytes == int(1.5 * 2**30) and not opts.fusion
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        SUITE.read_text().replace(
            "replicas:\n  gpu_memory_utilization: 0.9", "replicas: {kv_cache_gib: 2}"
        )
    )
    with pytest.raises(ConfigError, match="kv_cache_gib applies only with colocate: true"):
        load_pool_suite(bad)


def test_docstring_examples_run() -> None:
    result = doctest.testmod(pool_suite, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
