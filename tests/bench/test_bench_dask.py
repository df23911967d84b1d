"""Suites on Dask (`bench.fanout`): the same results on 2 workers as on 1, progress across
workers, a killed worker's unit retried once and marked, Prefect task runs per unit.

One local cluster is started by `Fanout(workers=2)` (the default `--workers N` path); the suite
tests share one existing cluster through `dask_address` (the `--dask-address` path), so the
module starts two clusters in all."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from bench_factories import write_hear_suite, write_pool_suite, write_suite

import maserve_prefect.bench.hear.scbench_suite as scbench_suite
from maserve_prefect.bench.fanout import SCHEDULER_CONFIG, Fanout, run_units
from maserve_prefect.bench.flow import run_suite
from maserve_prefect.bench.hear.arms import ArmRun, arm_unit
from maserve_prefect.bench.result import SuiteResult
from maserve_prefect.bench.units import UNIT_TASK, Unit
from maserve_prefect.errors import ConfigError, MaserveError

# Dask workers are spawned processes: ship this module's functions by value, not by import path.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

WALL_CLOCK = {
    # host CPU time of the HEAR control plane, measured per run (differs between two runs here)
    "arms": ("control_plane_ms", "control_plane_share", "makespan_incl_cp_s"),
    "overhead": ("total_ms", "per_turn_us", "p50_us", "p99_us", "share_of_makespan"),
}


def figures(res: SuiteResult) -> dict[str, Any]:
    """The suite's JSON without what is wall-clock by nature: where units ran (`units`), a pool
    suite's `wall_seconds`, the HEAR control plane's host CPU time, a replay audit's wall-clock
    release lateness."""
    data = res.to_json()
    data.pop("flow_run_id")
    data.pop("passed", None)  # a replay audit's verdict includes its wall-clock lateness goal
    data.pop("wall_seconds", None)
    tables = data["tables"]
    tables.pop("units", None)
    for name, cols in WALL_CLOCK.items():
        for row in tables.get(name, []):
            for c in cols:
                row.pop(c, None)
    for row in tables.get("conformance", []):
        for c in [c for c in row if "lateness" in c or "wall" in c or c == "passed"]:
            row.pop(c)
    return data


KILL_MARKER = "MASERVE_TEST_KILL_MARKER"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An existing Dask cluster of 2 worker processes (as `--dask-address` finds one), its
    scheduler set up as `bench.fanout` sets up its own; the workers inherit `KILL_MARKER`."""
    import dask
    from distributed import LocalCluster

    marker = tmp_path_factory.mktemp("kill") / "killed"
    with pytest.MonkeyPatch.context() as mp, dask.config.set(SCHEDULER_CONFIG):
        mp.setenv(KILL_MARKER, str(marker))
        with LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                          dashboard_address=None) as c:  # fmt: skip
            yield c.scheduler_address


def _square(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def test_units_run_on_two_workers_in_unit_order_with_progress_for_each() -> None:
    seen: list[tuple[int, int, str]] = []
    fanout = Fanout(workers=2)
    units = [Unit(f"u{i}", _square, (i,)) for i in range(6)]
    results, runs = run_units(units, fanout, lambda d, t, label: seen.append((d, t, label)))
    assert [v for v, _ in results] == [i * i for i in range(6)]
    assert os.getpid() not in {pid for _, pid in results}
    assert [d for d, _, _ in seen] == [1, 2, 3, 4, 5, 6] and {t for _, t, _ in seen} == {6}
    assert sorted(label for _, _, label in seen) == [f"u{i}" for i in range(6)]
    assert [r.label for r in runs] == [f"u{i}" for i in range(6)] and fanout.runs == runs
    assert sum(fanout.per_worker().values()) == 6
    assert all(r.worker.startswith("tcp://") and r.attempts == 1 for r in runs)


def test_bad_worker_count_or_address_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--workers 0: need at least 1"):
        run_suite(write_suite(tmp_path), "demo", prefect=False, workers=0)
    with pytest.raises(ConfigError, match="expected a scheduler address such as tcp://"):
        run_suite(write_suite(tmp_path), "demo", prefect=False, dask_address="localhost")


def test_a_replay_suite_on_two_workers_matches_one(tmp_path: Path, cluster: str) -> None:
    path = write_suite(tmp_path, analysis="bench_factories.count_rows")
    seen: list[tuple[int, int, str]] = []
    one = run_suite(path, "full", prefect=False)
    two = run_suite(path, "full", prefect=False, dask_address=cluster,
                    progress=lambda d, t, label: seen.append((d, t, label)))  # fmt: skip
    assert figures(two) == figures(one)
    assert "units" not in one.tables()  # the sequential path adds nothing
    units = two.tables()["units"]
    assert sorted(r["unit"] for r in units) == ["toy/dag/b0", "toy/dag/b1", "toy/flat/b0",
                                                "toy/flat/b1"]  # fmt: skip
    assert [d for d, _, _ in seen] == [1, 2, 3, 4]
    assert any(f"units on Dask cluster {cluster}: 4 units" in h for h in two.report.header)


def _killing_arm_unit(sset: Any, name: str, *args: Any) -> ArmRun:
    """`arm_unit`, except that the first `cache_aware` attempt kills its worker process."""
    marker = Path(os.environ[KILL_MARKER])
    if name == "cache_aware" and not marker.exists():
        marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return arm_unit(sset, name, *args)


def test_a_killed_worker_fails_its_unit_which_is_retried_once_and_marked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster: str
) -> None:
    path = write_hear_suite(tmp_path)
    one = run_suite(path, "demo", prefect=False)
    marker = Path(os.environ[KILL_MARKER])  # the cluster's workers were started with it
    monkeypatch.setattr(scbench_suite, "arm_unit", _killing_arm_unit)
    seen: list[tuple[int, int, str]] = []
    two = run_suite(path, "demo", prefect=False, dask_address=cluster,
                    progress=lambda d, t, label: seen.append((d, t, label)))  # fmt: skip
    assert marker.exists() and int(marker.read_text()) != os.getpid()  # a worker died
    assert figures(two) == figures(one)
    rows = {r["unit"]: r for r in two.tables()["units"]}
    assert (rows["cache_aware"]["attempts"], rows["cache_aware"]["retried"]) == (2, True)
    assert "worker died" in rows["cache_aware"]["error"]
    assert (rows["fcfs"]["attempts"], rows["fcfs"]["retried"]) == (1, False)
    assert not two.report.tables["units"].detail  # shown by default when a unit was retried
    assert any(h.startswith("RETRIED 1 unit(s)") and "cache_aware" in h
               for h in two.report.header)  # fmt: skip
    assert [d for d, _, _ in seen] == [1, 2]  # each unit counted once, when it finished


def _always_die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_unit_whose_worker_dies_twice_fails_the_suite_in_one_line(cluster: str) -> None:
    with pytest.raises(MaserveError, match="suite unit doomed: its worker died twice"):
        run_units([Unit("doomed", _always_die)], Fanout(address=cluster))


def test_a_hear_suite_on_dask_is_one_flow_run_with_a_task_run_per_unit(
    tmp_path: Path, prefect_api: None, cluster: str
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    path = write_hear_suite(tmp_path, name="daskhear")
    one = run_suite(path, "demo", prefect=False)
    seen: list[int] = []
    # the in-process progress callback is a flow parameter: it stays here, the units travel
    two = run_suite(path, "demo", dask_address=cluster,
                    progress=lambda d, t, label: seen.append(d))  # fmt: skip
    assert figures(two) == figures(one)
    assert two.flow_run_id is not None and seen == [1, 2]

    async def read() -> list[tuple[str, str, str]]:
        async with get_client() as client:
            runs = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[two.flow_run_id]))
            )
            return [(r.name, r.task_key, r.state_type.value if r.state_type else "") for r in runs]

    runs = asyncio.run(read())
    units = sorted((n, s) for n, k, s in runs if k.startswith("run_unit"))
    assert units == [("cache_aware", "COMPLETED"), ("fcfs", "COMPLETED")], runs
    assert UNIT_TASK == "maserve-suite-unit"


def test_a_pool_suite_on_two_workers_matches_one(
    tmp_path: Path, prefect_api: None, shared_data: Path, cluster: str
) -> None:
    path = write_pool_suite(tmp_path, shared_data / "profiles")
    one = run_suite(path, "tiny", prefect=False)
    two = run_suite(path, "tiny", prefect=False, dask_address=cluster)
    assert figures(two) == figures(one)
    assert sorted(r["unit"] for r in two.tables()["units"]) == [
        "burst/joint/run0", "burst/oracle/run0", "burst/pool-fcfs/run0"
    ]  # the arms, then the Oracle seeded with them  # fmt: skip


def test_replay_arm_flow_runs_on_dask_are_subflows_of_the_suite_flow_run(
    tmp_path: Path, prefect_api: None, cluster: str
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    path = write_suite(tmp_path, name="daskreplay")
    one = run_suite(path, "demo", prefect=False)
    two = run_suite(path, "demo", dask_address=cluster)
    assert figures(two) == figures(one)

    async def read() -> list[tuple[str, str]]:
        async with get_client() as client:
            runs = await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(
                    parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[two.flow_run_id])
                )
            )
            return [(r.name, r.state_type.value if r.state_type else "") for r in runs]

    read_runs = asyncio.run(read())
    arms = sorted(read_runs)
    # one maserve-replay-arm flow run per unit, each a subflow of the suite's flow run (Prefect
    # links a flow called inside a Dask task to the flow run the task belongs to)
    assert arms == [("toy-dag-b0", "COMPLETED"), ("toy-flat-b0", "COMPLETED")], read_runs
