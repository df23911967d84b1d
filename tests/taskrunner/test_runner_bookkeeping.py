"""MAServeTaskRunner's per-op bookkeeping: parameter scan, task naming, in-runner release, graph
teardown, and the harness recording a retried op once per attempt."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import uuid
from typing import Any

import pytest
from prefect import flow, task
from prefect.futures import PrefectConcurrentFuture
from prefect.utilities.annotations import quote

from maserve_prefect.taskrunner.harness import Harness, activate
from maserve_prefect.taskrunner.oprun import OpRun, Scope, scope
from maserve_prefect.taskrunner.opsubmit import named_task, scan_parameters
from maserve_prefect.taskrunner.runner import MAServeFuture, MAServeTaskRunner
from maserve_prefect.taskrunner.wallgate import WallGate
from maserve_prefect.trace.model import EdgeKind, Manifest, OpKind, OpStatus


def make_future() -> PrefectConcurrentFuture[Any]:
    return PrefectConcurrentFuture(uuid.uuid4(), concurrent.futures.Future())


@dataclasses.dataclass
class Box:
    item: Any


def test_scan_quotes_future_free_values_and_finds_futures_in_traversal_order() -> None:
    f1, f2, f3, f4, f5 = (make_future() for _ in range(5))
    params = {
        "n": 3,
        "text": "hi",
        "xs": [f1, 2, ("a", f2)],
        "by_key": {"k": f3, "plain": [1, 2]},
        "box": Box(f4),
        "group": frozenset({f5}),
        "plain": {"a": [1, 2]},
    }
    quoted, found = scan_parameters(params)
    assert found == [f1, f2, f3, f4, f5]
    assert quoted["n"] == quote(3) and quoted["text"] == quote("hi")
    # Containers holding a future are rebuilt around it, their future-free parts quoted.
    assert quoted["xs"] == [f1, quote(2), (quote("a"), f2)]
    assert quoted["by_key"] == {"k": f3, "plain": quote([1, 2])}
    # A dataclass is not rebuilt: its future is an edge, the value goes to Prefect quoted.
    assert quoted["box"] == quote(params["box"])
    # A set that holds a future goes as it is; a future-free dict is quoted whole.
    assert quoted["group"] is params["group"]
    assert quoted["plain"] == quote({"a": [1, 2]})


def test_named_copy_escapes_braces_and_leaves_the_task_alone() -> None:
    @task
    def t(x: int) -> int:
        return x

    named = named_task(t, "r/{stage}/0")
    assert named is not t and type(named) is type(t)
    assert named.task_run_name == "r/{{stage}}/0"  # Prefect formats it: renders "r/{stage}/0"
    assert t.task_run_name is None
    assert named.fn is t.fn and named.name == t.name


@task
def add(*xs: int) -> int:
    return sum(xs) + 1


def _diamond(width: int, depth: int) -> tuple[list[list[MAServeFuture]], int]:
    layers: list[list[MAServeFuture]] = []
    with scope(root_id="r0", stage_id="d"):
        layers.append([add.submit(i) for i in range(width)])
        for _ in range(depth - 1):
            up = layers[-1]
            layers.append([add.submit(up[i], up[(i + 1) % width]) for i in range(width)])
        return layers, sum(f.result() for f in layers[-1])


def test_in_runner_edges_release_ops_record_deps_and_drop_the_graph(prefect_api: None) -> None:
    width, depth = 3, 3
    box: list[tuple[list[list[MAServeFuture]], int]] = []
    harness = Harness(WallGate(), Manifest(trace_id="diamond"), engine_kind="wall")

    @flow(task_runner=MAServeTaskRunner(max_workers=2), persist_result=False)
    def diamond() -> None:
        box.append(_diamond(width, depth))

    with activate(harness):
        diamond()
    layers, total = box[0]
    # Layer values: 1..3, then pairs summed + 1 (same as a plain Python evaluation).
    vals = [i + 1 for i in range(width)]
    for _ in range(depth - 1):
        vals = [vals[i] + vals[(i + 1) % width] + 1 for i in range(width)]
    assert total == sum(vals)
    ops = {op.op_id: op for op in harness.book.ops}
    assert len(ops) == width * depth
    for lower, upper in itertools.pairwise(layers):
        for i, fut in enumerate(upper):
            want = [lower[i].op_id, lower[(i + 1) % width].op_id]
            assert [(d.op_id, d.kind) for d in ops[fut.op_id].deps] == [
                (w, EdgeKind.DATA) for w in want
            ]
    for fut in layers[0]:
        assert ops[fut.op_id].deps == ()
    # Every op was recorded after its predecessors and released once they were done.
    order = [op.op_id for op in harness.book.ops]
    for op in harness.book.ops:
        for d in op.deps:
            assert order.index(d.op_id) < order.index(op.op_id)
            assert ops[d.op_id].times.completed_s <= op.times.ready_s
    # The runner let go of its op graph when the flow run ended.
    assert all(f._node is None for layer in layers for f in layer)


def test_finish_records_failed_attempts_then_the_final_one() -> None:
    harness = Harness(WallGate(), Manifest(trace_id="retry"), engine_kind="wall")
    s = Scope(root_id="r0", stage_id="gen", session_id="writer")
    harness.see_scope(s)
    op = OpRun(op_id=harness.new_op_id(s), scope=s, kind=OpKind.MODEL, task_name="m")
    op.ready_s, op.completed_s = 1.0, 3.0
    op.failed_attempts = [(1.0, 2.0, "engine died")]
    final = harness.finish(op, flow_run_id=None, task_run_id="t-1")
    assert final.op_id == "r0/writer/0"
    assert (final.stage_id, final.session_id) == ("r0/gen", "r0/writer")
    assert [(r.attempt, r.status) for r in harness.book.ops] == [
        (1, OpStatus.FAILED),
        (2, OpStatus.COMPLETED),
    ]
    assert harness.book.ops[-1] == final
    assert harness.book.ops[0].error == "engine died"
    assert harness.book.ops[0].times.completed_s == pytest.approx(2.0)
