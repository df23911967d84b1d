"""The runner's op-graph walks on tiny hand-built graphs.

Graph shape used below (M = model op, T = maserve transform, P = plain Prefect task):

    m1 (M) ──> t1 (T) ──> t2 (T) ──> m2 (M)
                 ^
    p1 (P) ──────┘
"""

from __future__ import annotations

import concurrent.futures
import uuid

from maserve_prefect.taskrunner.opfutures import MAServeFuture
from maserve_prefect.taskrunner.opgraph import (
    OpNode,
    OpState,
    effective_upstream,
    model_ops_ahead,
    model_preds,
)
from maserve_prefect.taskrunner.oprun import OpRun, Scope
from maserve_prefect.trace.model import OpKind


def make_node(op_id: str, kind: OpKind, *, maserve: bool = True) -> OpNode:
    """A node as the runner builds it: model ops are `model`, other maserve ops `see_through`."""
    task_run_id = uuid.uuid4()
    return OpNode(
        task_run_id=task_run_id,
        op=OpRun(op_id=op_id, scope=Scope(), kind=kind, task_name=op_id),
        task=None,
        parameters={},
        wait_for=None,
        dependencies=None,
        context=None,
        future=MAServeFuture(task_run_id, concurrent.futures.Future(), None, op_id),
        flow_run_id=None,
        remote=False,
        model=kind is OpKind.MODEL,
        see_through=kind is not OpKind.MODEL and maserve,
    )


def link(up: OpNode, down: OpNode) -> None:
    up.downstream.append(down)
    down.upstream.append(up)


def make_graph() -> dict[str, OpNode]:
    g = {
        "m1": make_node("m1", OpKind.MODEL),
        "p1": make_node("p1", OpKind.TRANSFORM, maserve=False),
        "t1": make_node("t1", OpKind.TRANSFORM),
        "t2": make_node("t2", OpKind.TRANSFORM),
        "m2": make_node("m2", OpKind.MODEL),
    }
    link(g["m1"], g["t1"])
    link(g["p1"], g["t1"])
    link(g["t1"], g["t2"])
    link(g["t2"], g["m2"])
    return g


def ids(nodes: list[OpNode]) -> list[str]:
    return [n.op.op_id for n in nodes]


def test_effective_upstream_looks_through_pending_maserve_ops_only() -> None:
    g = make_graph()
    assert ids(effective_upstream(g["m2"])) == ["m1", "p1"]
    g["t1"].state = OpState.STARTED  # a started op is no longer looked through
    assert ids(effective_upstream(g["m2"])) == ["t1"]
    g["t1"].state, g["t2"].state = OpState.PENDING, OpState.DONE
    assert ids(effective_upstream(g["m2"])) == ["t2"]


def test_model_preds_go_through_every_non_model_op() -> None:
    g = make_graph()
    g["t1"].state, g["t2"].state = OpState.DONE, OpState.STARTED  # state does not matter here
    assert model_preds(g["m2"]) == ("m1",)
    assert model_preds(g["t1"]) == ("m1",)
    assert model_preds(g["m1"]) == ()


def test_model_ops_ahead_skip_the_direct_downstream_and_stop_at_started_ops() -> None:
    g = make_graph()
    assert ids(model_ops_ahead(g["m1"].downstream)) == ["m2"]
    assert ids(model_ops_ahead(g["t2"].downstream)) == []  # m2 is direct downstream
    g["t2"].state = OpState.STARTED
    assert ids(model_ops_ahead(g["m1"].downstream)) == []
