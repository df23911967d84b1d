"""MAServeTaskRunner wrapping prefect-dask's process cluster: ops held here, run elsewhere."""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest
from maserve_prefect.tasks.ops_common import op_task
from prefect import flow, task
from prefect_dask import DaskTaskRunner

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.errors import ConfigError
from maserve_prefect.taskrunner.harness import Harness, activate
from maserve_prefect.taskrunner.lockstep import VirtualGate
from maserve_prefect.taskrunner.oprun import scope
from maserve_prefect.taskrunner.runner import MAServeTaskRunner
from maserve_prefect.taskrunner.wallgate import WallGate
from maserve_prefect.trace.model import EdgeKind, Manifest, OpKind, OpStatus

pytestmark = pytest.mark.usefixtures("prefect_api")

# Dask workers are spawned processes: ship this module's functions by value, not by import path.
cloudpickle.register_pickle_by_value(__import__(__name__))


def _process_cluster() -> DaskTaskRunner:
    return DaskTaskRunner(
        cluster_kwargs={"n_workers": 2, "processes": True, "threads_per_worker": 1},
    )


@task(persist_result=False)
def source(x: int) -> tuple[int, int]:
    return x, os.getpid()


@task(persist_result=False)
def add(a: Any, k: int) -> tuple[int, int]:
    return a[0] + k, os.getpid()


@task(persist_result=False)
def join(b: Any, c: Any) -> tuple[int, list[int]]:
    return b[0] * c[0], [b[1], c[1], os.getpid()]


@task(persist_result=False)
def boom(x: int) -> int:
    raise RuntimeError(f"boom {x}")


@op_task(OpKind.TRANSFORM)
def maserve_op(x: int) -> int:
    return x


def _diamond() -> tuple[int, list[int]]:
    with scope(root_id="r0", stage_id="diamond"):
        a = source.submit(3)  # → (3, pid)
        b = add.submit(a, 1)  # → 4
        c = add.submit(a, 2)  # → 5
        d = join.submit(b, c, wait_for=[a])  # type: ignore[call-overload]  # → 20
        value, pids = d.result()
        return value, [*pids, a.result()[1]]


@pytest.fixture(scope="module")
def diamond_run() -> Iterator[tuple[tuple[int, list[int]], Harness]]:
    harness = Harness(WallGate(), Manifest(trace_id="dask"), engine_kind="wall")
    runner: Any = MAServeTaskRunner(max_workers=2, inner=_process_cluster())
    with activate(harness):
        result = flow(name="dask-diamond", task_runner=runner)(_diamond)()
    yield result, harness


def test_diamond_runs_in_dask_worker_processes(
    diamond_run: tuple[tuple[int, list[int]], Harness],
) -> None:
    (value, pids), _ = diamond_run
    assert value == (3 + 1) * (3 + 2)
    assert len(pids) == 4
    assert os.getpid() not in pids, "every task ran in a dask worker process, not here"


def test_diamond_records_ops_with_typed_deps_here(
    diamond_run: tuple[tuple[int, list[int]], Harness],
) -> None:
    _, harness = diamond_run
    ops = {op.op_id: op for op in harness.book.ops}
    a, b, c, d = (f"r0/diamond/{i}" for i in range(4))
    assert set(ops) == {a, b, c, d}
    deps = {k: sorted((dep.op_id, dep.kind) for dep in op.deps) for k, op in ops.items()}
    assert deps[a] == []
    assert deps[b] == [(a, EdgeKind.DATA)]
    assert deps[c] == [(a, EdgeKind.DATA)]
    assert deps[d] == [(a, EdgeKind.CONTROL), (b, EdgeKind.DATA), (c, EdgeKind.DATA)]
    assert all(op.status is OpStatus.COMPLETED for op in ops.values())
    ready = {k: op.times.ready_s for k, op in ops.items()}
    done = {k: op.times.completed_s for k, op in ops.items()}
    assert all(ready[k] is not None and done[k] is not None for k in ops)
    assert all(ready[k] <= done[k] for k in ops)  # type: ignore[operator]
    # d became ready only after both its data predecessors finished.
    assert ready[d] >= max(done[b], done[c])  # type: ignore[operator,type-var]
    # Linked to the task runs the inner runner really created (distinct ids, one per op).
    assert len(set(harness.book.task_runs.values())) == 4


def test_failed_remote_task_fails_downstream_and_is_recorded() -> None:
    harness = Harness(WallGate(), Manifest(trace_id="dask-fail"), engine_kind="wall")

    def body() -> tuple[Any, Any]:
        with scope(root_id="r1", stage_id="s"):
            x = boom.submit(1)
            y = add.submit(x, 1)
            return x.wait() or x.state, y.wait() or y.state

    runner: Any = MAServeTaskRunner(max_workers=2, inner=_process_cluster())
    with activate(harness):
        x_state, y_state = flow(name="dask-fail", task_runner=runner)(body)()
    assert x_state.is_failed() and "boom 1" in str(x_state.message) + repr(x_state.data)
    assert not y_state.is_completed()
    ops = {op.op_id: op for op in harness.book.ops}
    assert ops["r1/s/0"].status is OpStatus.FAILED


def test_maserve_op_on_inner_runner_under_virtual_time_is_refused() -> None:
    gate = VirtualGate(Kernel())
    harness = Harness(gate, Manifest(trace_id="dask-virtual"))
    # A thread-pool stand-in for the inner runner: the check happens before anything runs there.
    from prefect.task_runners import ThreadPoolTaskRunner

    def body() -> None:
        with scope(root_id="r2", stage_id="s"):
            maserve_op.submit(1)

    runner: Any = MAServeTaskRunner(inner=ThreadPoolTaskRunner(max_workers=1))
    with gate, activate(harness), pytest.raises(ConfigError, match="cannot run on the inner"):
        flow(name="virtual-refused", task_runner=runner)(body)()
    assert harness.book.ops == []


def test_pickle_round_trip_keeps_the_inner_runner() -> None:
    runner = MAServeTaskRunner(max_workers=3, harness="h9", inner=_process_cluster())
    for blob in (pickle.dumps(runner), cloudpickle.dumps(runner)):
        back = pickle.loads(blob)
        assert back == runner
        assert isinstance(back.inner, DaskTaskRunner)
        assert back.inner.cluster_kwargs == {
            "n_workers": 2, "processes": True, "threads_per_worker": 1,
        }  # fmt: skip
        assert back.inner is not runner.inner
    dup = runner.duplicate()
    assert dup == runner and dup.inner is not runner.inner
    assert MAServeTaskRunner(max_workers=3, harness="h9") != runner


def test_inner_must_be_a_task_runner() -> None:
    with pytest.raises(ConfigError, match="TaskRunner instance"):
        MAServeTaskRunner(inner=DaskTaskRunner)  # type: ignore[arg-type]
