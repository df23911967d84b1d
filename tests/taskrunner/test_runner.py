"""MAServeTaskRunner: ops held until ready, lockstep virtual time, recorded hierarchy and deps."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from prefect import flow, task

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.taskrunner.harness import Harness, activate, active_harness
from maserve_prefect.taskrunner.lockstep import VirtualGate
from maserve_prefect.taskrunner.oprun import current_op, scope
from maserve_prefect.taskrunner.runner import MAServeFuture, MAServeTaskRunner
from maserve_prefect.trace.model import EdgeKind, Manifest

pytestmark = pytest.mark.usefixtures("prefect_api")


@task
def step(x: int, dt: float) -> int:
    h = active_harness()
    op = current_op()
    assert h is not None and op is not None
    h.gate.sleep(dt, what=op.op_id)
    return x + 1


@flow(task_runner=MAServeTaskRunner(max_workers=2))
def chain_flow(n: int) -> int:
    with scope(root_id="r0", stage_id="chain"):
        fut = step.submit(0, 1.0)
        for _ in range(n - 1):
            fut = step.submit(fut, 1.0)
        side = step.submit(0, 0.5, wait_for=[fut])
        return fut.result() + side.result()


def _run(flow_fn: Any, *args: Any) -> tuple[Any, Harness]:
    gate = VirtualGate(Kernel())
    harness = Harness(gate, Manifest(trace_id="test"))
    with gate, activate(harness):
        result = flow_fn(*args)
    return result, harness


def test_long_chain_never_parks_a_worker_on_a_future(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[tuple[str, bool]] = []
    original = MAServeFuture._gate_wait

    def spy(self: MAServeFuture) -> None:
        waits.append((threading.current_thread().name, self.wrapped_future.done()))
        original(self)

    monkeypatch.setattr(MAServeFuture, "_gate_wait", spy)
    result, harness = _run(chain_flow, 200)
    assert result == 200 + 1
    assert len(harness.book.ops) == 201
    worker_waits = [done for name, done in waits if name.startswith("maserve-op")]
    assert worker_waits, "the task engine resolves upstream futures inside workers"
    assert all(worker_waits), "a worker thread waited on a future that was not done"
    # Virtual time: 200 chained 1 s ops, then the 0.5 s op released after the chain.
    assert harness.gate.now() == pytest.approx(200.5)


def test_records_hierarchy_typed_deps_and_virtual_times() -> None:
    _, harness = _run(chain_flow, 3)
    ops = {op.op_id: op for op in harness.book.ops}
    assert set(ops) == {"r0/chain/0", "r0/chain/1", "r0/chain/2", "r0/chain/3"}
    assert [(d.op_id, d.kind) for d in ops["r0/chain/1"].deps] == [("r0/chain/0", EdgeKind.DATA)]
    assert [(d.op_id, d.kind) for d in ops["r0/chain/3"].deps] == [("r0/chain/2", EdgeKind.CONTROL)]
    assert ops["r0/chain/2"].times.ready_s == 2.0
    assert ops["r0/chain/2"].times.completed_s == 3.0
    assert ops["r0/chain/3"].times.completed_s == 3.5
    assert set(harness.book.roots) == {"r0"}


def test_same_flow_twice_gives_identical_records() -> None:
    _, first = _run(chain_flow, 12)
    _, second = _run(chain_flow, 12)
    key = lambda op: op.op_id  # noqa: E731
    assert sorted(first.book.ops, key=key) == sorted(second.book.ops, key=key)


def test_near_ready_ops_are_reported_to_the_dispatcher() -> None:
    """An op whose predecessors are all done or running (one running) is reported once as
    near-ready before it becomes ready: the hook prefetch and placement plug into."""
    from maserve_prefect.dispatch.dispatcher import Dispatcher

    gate = VirtualGate(Kernel())
    dispatcher = Dispatcher(list, gate.now)
    harness = Harness(gate, Manifest(trace_id="near"), dispatcher=dispatcher)
    with gate, activate(harness):
        assert chain_flow(5) == 6
    # chain of 5 + the side op: every op but the first has a predecessor that ran before it.
    assert dispatcher.stats.by_event.get("near_ready") == 5
