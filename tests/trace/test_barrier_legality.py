"""Barrier legality as the seed paper states it (§2.1, §4.2, App. C.2): a barrier serializes
*independent* ops of *one stage* — no data / artifact / state flow between them, no shared-state
version conflict — and the edge it adds records that it is a coordination edge and its stage."""

from __future__ import annotations

import pytest

from maserve_prefect.errors import IllegalReleaseError
from maserve_prefect.trace.barrier import BarrierEdge, apply_barrier, barrier_edges
from maserve_prefect.trace.model import (
    Dep,
    DepOrigin,
    EdgeKind,
    Manifest,
    OpKind,
    OpRecord,
    OpTimes,
    RootRecord,
    Trace,
)
from maserve_prefect.trace.release import ReleaseRule, release_predecessors


def op(
    op_id: str,
    kind: OpKind = OpKind.MODEL,
    *deps: tuple[str, EdgeKind],
    stage: str = "r/s",
    done_s: float | None = None,
) -> OpRecord:
    return OpRecord(
        op_id=op_id,
        root_id="r",
        stage_id=stage,
        kind=kind,
        deps=tuple(Dep(op_id=d, kind=k) for d, k in deps),
        times=OpTimes(completed_s=done_s),
    )


def trace(*ops: OpRecord) -> Trace:
    return Trace(manifest=Manifest(trace_id="t"), roots=[RootRecord(root_id="r")], ops=list(ops))


# One stage "r/s": w0 writes state version 1 at 1 s; rd reads it at 2 s (a state edge to w0);
# w writes version 2 at 5 s; x is a model call rd's reader feeds from (x -> rd data edge) and y
# an unrelated model call of the same stage.
STATE = trace(
    op("r/w0", OpKind.STATE_WRITE, done_s=1.0),
    op("r/x", OpKind.MODEL, done_s=1.5),
    op("r/rd", OpKind.STATE_READ, ("r/w0", EdgeKind.STATE), ("r/x", EdgeKind.DATA), done_s=2.0),
    op("r/w", OpKind.STATE_WRITE, done_s=5.0),
    op("r/y", OpKind.MODEL, done_s=3.0),
)


def test_write_before_a_read_that_recorded_an_older_version_is_refused() -> None:
    with pytest.raises(IllegalReleaseError) as exc:
        apply_barrier(STATE, [BarrierEdge("r/w", "r/rd")])
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg == (
        "barrier edge r/w -> r/rd: shared-state version conflict: it orders state_write r/w "
        "before state_read r/rd, but state_read r/rd recorded an older version than "
        "state_write r/w would leave; a barrier may not reorder state operations"
    )


def test_a_conflict_through_recorded_deps_is_refused_too() -> None:
    # w -> x, and x feeds rd: the barrier puts w before rd transitively
    with pytest.raises(IllegalReleaseError, match=r"r/w -> r/x: shared-state version conflict"):
        apply_barrier(STATE, [BarrierEdge("r/w", "r/x")])
    # reversing the recorded order of two writes is a conflict as well
    with pytest.raises(IllegalReleaseError, match=r"orders state_write r/w before state_write"):
        apply_barrier(STATE, [BarrierEdge("r/w", "r/w0")])


def test_orders_the_recorded_run_already_had_are_legal() -> None:
    # rd read before w wrote: ordering rd -> w keeps every recorded version
    changed = apply_barrier(STATE, [BarrierEdge("r/rd", "r/w"), BarrierEdge("r/y", "r/x")])
    assert release_predecessors(changed, ReleaseRule.BARRIER)["r/w"] == ("r/rd",)


def test_barrier_between_dependent_ops_is_refused() -> None:
    # rd read w0's version (a state edge): not independent
    with pytest.raises(
        IllegalReleaseError,
        match=r"^barrier edge r/w0 -> r/rd: the ops are not independent \(r/w0 -> r/rd through",
    ):
        barrier_edges(STATE, [BarrierEdge("r/w0", "r/rd")])
    with pytest.raises(IllegalReleaseError, match=r"r/x -> r/rd: the ops are not independent"):
        barrier_edges(STATE, [BarrierEdge("r/x", "r/rd")])


def test_barrier_across_stages_is_refused_with_one_line() -> None:
    tr = trace(op("r/a", stage="r/analyze"), op("r/b", stage="r/write"))
    with pytest.raises(IllegalReleaseError) as exc:
        apply_barrier(tr, [BarrierEdge("r/a", "r/b")])
    assert str(exc.value) == (
        "barrier edge r/a -> r/b crosses stages (r/analyze -> r/write); a barrier orders ops of "
        "one stage only"
    )


def test_legal_barrier_is_a_coordination_edge_with_its_stage() -> None:
    # four independent analyses of one fork-join stage, serialized by three edges (paper C.2)
    tr = trace(
        op("r/in", stage="r/plan"),
        *(op(f"r/w{i}", OpKind.MODEL, ("r/in", EdgeKind.DATA), stage="r/fj") for i in range(4)),
        op("r/join", OpKind.MODEL, *((f"r/w{i}", EdgeKind.DATA) for i in range(4)), stage="r/fj"),
    )
    edges = [BarrierEdge(f"r/w{i}", f"r/w{i + 1}") for i in range(3)]
    assert [e.stage for e in barrier_edges(tr, edges)] == ["r/fj"] * 3
    changed = apply_barrier(tr, edges)
    w3 = changed.op_index()["r/w3"]
    added = [d for d in w3.deps if d.origin is DepOrigin.BARRIER]
    assert added == [
        Dep(op_id="r/w2", kind=EdgeKind.CONTROL, required=False, origin=DepOrigin.BARRIER,
            stage="r/fj")
    ]  # fmt: skip
    assert added[0].is_coordination
    assert not any(d.is_coordination for d in tr.op_index()["r/join"].deps)
    # the stage survives serialization; recorded deps serialize without it
    line = w3.to_json_line()
    assert '"stage":"r/fj"' in line and line.count('"stage"') == 1
    assert OpRecord.model_validate_json(line) == w3
    # the DAG rule drops exactly the coordination edges
    assert release_predecessors(changed, "dag") == release_predecessors(tr, "dag")
