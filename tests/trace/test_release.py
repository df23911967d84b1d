"""Tests for trace.release and trace.barrier: barrier legality and the named release rules."""

from __future__ import annotations

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maserve_prefect.errors import IllegalReleaseError, TraceValidationError
from maserve_prefect.trace.barrier import (
    BarrierEdge,
    PerRootEdge,
    StageBarrier,
    apply_barrier,
    barrier_edges,
    check_legal_change,
    expand_per_root_edge,
)
from maserve_prefect.trace.model import (
    Dep,
    DepOrigin,
    EdgeKind,
    Manifest,
    OpKind,
    OpRecord,
    OpTimes,
    RootRecord,
    StageRecord,
    Trace,
)
from maserve_prefect.trace.release import ReleaseRule, release_plan, release_predecessors


def make_op(
    op_id: str, *deps: str, root: str = "r", stage: str = "", submitted_s: float | None = None
) -> OpRecord:
    return OpRecord(
        op_id=op_id,
        root_id=root,
        stage_id=stage,
        kind=OpKind.MODEL,
        deps=tuple(Dep(op_id=d, kind=EdgeKind.DATA) for d in deps),
        times=OpTimes(submitted_s=submitted_s),
    )


def make_trace(*ops: OpRecord, stages: tuple[StageRecord, ...] = ()) -> Trace:
    roots = [RootRecord(root_id=r, arrival_s=1.0) for r in dict.fromkeys(o.root_id for o in ops)]
    return Trace(manifest=Manifest(trace_id="t"), roots=roots, ops=list(ops), stages=list(stages))


def fork_join() -> Trace:
    # a1, a2 independent analysts; s waits for both.
    return make_trace(make_op("a1"), make_op("a2"), make_op("s", "a1", "a2"))


def test_rule_causality_flags() -> None:
    assert ReleaseRule.DAG.is_causal and ReleaseRule.BARRIER.is_causal
    assert not ReleaseRule.FLAT.is_causal and not ReleaseRule.ARRIVAL.is_causal


def test_barrier_adds_non_required_control_edge_and_keeps_original() -> None:
    tr = fork_join()
    changed = apply_barrier(tr, [BarrierEdge("a1", "a2", note="serialize analysts")])
    a2 = changed.op_index()["a2"]
    # a coordination edge carrying its stage (ops without a stage id: the root's stage "r")
    assert a2.deps == (
        Dep(op_id="a1", kind=EdgeKind.CONTROL, required=False, origin=DepOrigin.BARRIER, stage="r"),
    )
    assert a2.deps[0].is_coordination
    assert changed.op_index()["s"].deps == tr.op_index()["s"].deps
    assert tr.op_index()["a2"].deps == ()  # input untouched
    check_legal_change(tr, changed)


def test_a_repeated_edge_is_added_once() -> None:
    changed = apply_barrier(fork_join(), [BarrierEdge("a1", "a2")] * 2)
    assert [d.origin for d in changed.op_index()["a2"].deps] == [DepOrigin.BARRIER]


def test_barrier_between_dependent_ops_is_refused_naming_both() -> None:
    # s consumes a1's artifact: a barrier a1 -> s is no barrier between independent ops
    with pytest.raises(
        IllegalReleaseError,
        match=r"^barrier edge a1 -> s: the ops are not independent \(a1 -> s through recorded",
    ):
        apply_barrier(fork_join(), [BarrierEdge("a1", "s")])
    # ... and reversing the flow is refused the same way, before any cycle check
    with pytest.raises(IllegalReleaseError, match=r"s -> a1: the ops are not independent"):
        apply_barrier(fork_join(), [BarrierEdge("s", "a1")])
    # transitive flow: a -> b -> c makes a and c dependent
    chain = make_trace(make_op("a"), make_op("b", "a"), make_op("c", "b"))
    with pytest.raises(IllegalReleaseError, match=r"not independent \(a -> b -> c through"):
        apply_barrier(chain, [BarrierEdge("a", "c")])


def test_cycle_of_barrier_edges_is_rejected_and_named() -> None:
    with pytest.raises(IllegalReleaseError, match=r"cycle (a2 -> a1 -> a2|a1 -> a2 -> a1)"):
        apply_barrier(fork_join(), [BarrierEdge("a1", "a2"), BarrierEdge("a2", "a1")])


def test_self_edge_is_refused() -> None:
    with pytest.raises(IllegalReleaseError, match="a1 -> a1 orders an op after itself"):
        apply_barrier(fork_join(), [BarrierEdge("a1", "a1")])


def test_unknown_op_and_cross_root_edges_rejected() -> None:
    with pytest.raises(IllegalReleaseError, match="unknown op 'nope'"):
        apply_barrier(fork_join(), [BarrierEdge("a1", "nope")])
    tr = make_trace(make_op("x/a", root="x"), make_op("y/a", root="y"))
    with pytest.raises(IllegalReleaseError, match="crosses roots"):
        apply_barrier(tr, [BarrierEdge("x/a", "y/a")])


def test_stage_barrier_by_name_in_every_root() -> None:
    ops = []
    stages = []
    for r in ("p", "q"):
        stages += [
            StageRecord(stage_id=f"{r}/s1", root_id=r, name="draft"),
            StageRecord(stage_id=f"{r}/s2", root_id=r, name="review"),
        ]
        ops += [
            make_op(f"{r}/d1", root=r, stage=f"{r}/s1"),
            make_op(f"{r}/d2", root=r, stage=f"{r}/s1"),
            make_op(f"{r}/v1", root=r, stage=f"{r}/s2"),
        ]
    tr = make_trace(*ops, stages=tuple(stages))
    # Two stage instances are two stages for the trace alone: the barrier is refused ...
    with pytest.raises(
        IllegalReleaseError, match=r"barrier edge p/d1 -> p/v1 crosses stages \(p/s1 -> p/s2\)"
    ):
        apply_barrier(tr, [StageBarrier("draft", "review")])

    # ... unless a StageOf puts them in one (replay.coordination: branches of a Γ parallel).
    def one_fork(a: OpRecord, b: OpRecord) -> str:
        return f"{a.root_id}/fork"

    changed = apply_barrier(tr, [StageBarrier("draft", "review")], one_fork)
    preds = release_predecessors(changed, ReleaseRule.BARRIER)
    assert preds["p/v1"] == ("p/d1", "p/d2")
    assert preds["q/v1"] == ("q/d1", "q/d2")
    assert {d.stage for d in changed.op_index()["q/v1"].deps} == {"q/fork"}
    only_q = apply_barrier(tr, [StageBarrier("draft", "review", root_id="q")], one_fork)
    assert release_predecessors(only_q, ReleaseRule.BARRIER)["p/v1"] == ()
    with pytest.raises(IllegalReleaseError, match="known stages: draft, review"):
        apply_barrier(tr, [StageBarrier("draft", "reveiw")], one_fork)


def research_roots(*roots: str, early_stop: str = "") -> Trace:
    """Roots of a lead spawning two researchers then a writer with up to two drafts: op ids
    `<root>/lead/0`, `<root>/child0/0`, `<root>/child1/0`, `<root>/write/0` (and `write/1`
    unless the root is `early_stop`, whose refinement accepted its first draft)."""
    ops = []
    for r in roots:
        ops += [
            make_op(f"{r}/lead/0", root=r),
            make_op(f"{r}/child0/0", f"{r}/lead/0", root=r),
            make_op(f"{r}/child1/0", f"{r}/lead/0", root=r),
            make_op(f"{r}/write/0", f"{r}/child0/0", f"{r}/child1/0", root=r),
        ]
        if r != early_stop:
            ops.append(make_op(f"{r}/write/1", f"{r}/write/0", root=r))
            ops.append(make_op(f"{r}/child2/0", f"{r}/lead/0", root=r))
    return make_trace(*ops)


def test_per_root_edge_expands_to_every_root_with_its_note() -> None:
    tr = research_roots("r0000", "r0001", "r0002")
    changed = apply_barrier(tr, [PerRootEdge("child0/0", "child1/0")])
    preds = release_predecessors(changed, ReleaseRule.BARRIER)
    for r in ("r0000", "r0001", "r0002"):
        assert preds[f"{r}/child1/0"] == (f"{r}/lead/0", f"{r}/child0/0")
        assert preds[f"{r}/child0/0"] == (f"{r}/lead/0",)
    check_legal_change(tr, changed)
    assert release_predecessors(changed, ReleaseRule.DAG) == release_predecessors(tr, "dag")
    edges = barrier_edges(tr, [PerRootEdge("child0/0", "child1/0")])
    assert [(e.src_op, e.dst_op, e.note) for e in edges] == [
        (f"{r}/child0/0", f"{r}/child1/0", "each root child0/0 -> child1/0")
        for r in ("r0000", "r0001", "r0002")
    ]


def test_per_root_edge_works_on_prefixed_cohorts_and_skips_already_linked_pairs() -> None:
    from maserve_prefect.replay.traceset import prefixed

    tr = prefixed(research_roots("r0", "r1"), "research")
    assert tr.ops[0].op_id == "research/r0/lead/0"
    edges = barrier_edges(
        tr, [PerRootEdge("child0/0", "child1/0"), PerRootEdge("child1/0", "child2/0")]
    )
    assert [(e.src_op, e.dst_op) for e in edges] == [
        ("research/r0/child0/0", "research/r0/child1/0"),
        ("research/r1/child0/0", "research/r1/child1/0"),
        ("research/r0/child1/0", "research/r0/child2/0"),
        ("research/r1/child1/0", "research/r1/child2/0"),
    ]
    # lead/0 reaches write/0 through child0/0: dependent ops, refused (never silently dropped)
    with pytest.raises(IllegalReleaseError, match=r"research/r0/lead/0 -> research/r0/write/0"):
        barrier_edges(tr, [PerRootEdge("lead/0", "write/0")])


def test_per_root_edge_skips_a_root_that_did_not_realize_an_op() -> None:
    tr = research_roots("r0", "r1", "r2", early_stop="r1")
    edges = expand_per_root_edge(tr, PerRootEdge("child1/0", "child2/0"))
    assert [e.dst_op for e in edges] == ["r0/child2/0", "r2/child2/0"]
    changed = apply_barrier(tr, [PerRootEdge("child1/0", "child2/0")])
    assert [d.op_id for d in changed.op_index()["r0/child2/0"].deps] == ["r0/lead/0", "r0/child1/0"]
    assert changed.op_index()["r1/child1/0"].deps == tr.op_index()["r1/child1/0"].deps


def test_per_root_edge_with_an_op_no_root_realized_is_refused_and_named() -> None:
    tr = research_roots("r0", "r1")
    with pytest.raises(
        IllegalReleaseError,
        match=r"per-root barrier edge child0/0 -> child9/0: no root of the trace holds op 'child9/0'"
        r".*e\.g\. child0/0, child1/0, child2/0, lead/0, write/0, write/1",
    ):
        apply_barrier(tr, [PerRootEdge("child0/0", "child9/0")])
    # a full op id is not a relative one
    with pytest.raises(IllegalReleaseError, match=r"holds op 'r0/child0/0' or 'r0/child1/0';"):
        apply_barrier(tr, [PerRootEdge("r0/child0/0", "r0/child1/0")])


def test_per_root_edge_whose_ops_never_meet_in_one_root_is_refused() -> None:
    tr = make_trace(make_op("p/a", root="p"), make_op("q/b", root="q"))
    with pytest.raises(IllegalReleaseError, match=r"a -> b: no root realized both ops"):
        apply_barrier(tr, [PerRootEdge("a", "b")])


def test_per_root_edges_that_make_a_cycle_are_refused() -> None:
    tr = research_roots("r0", "r1")
    # reverses the recorded dep lead/0 -> child0/0 in every root: dependent ops
    with pytest.raises(IllegalReleaseError, match=r"r0/child0/0 -> r0/lead/0: the ops are not"):
        apply_barrier(tr, [PerRootEdge("child0/0", "lead/0")])
    # two per-root edges against each other
    with pytest.raises(
        IllegalReleaseError, match=r"cycle (r0/child0/0 -> r0/child1/0|r0/child1/0 -> r0/child0/0)"
    ):
        apply_barrier(
            tr, [PerRootEdge("child0/0", "child1/0"), PerRootEdge("child1/0", "child0/0")]
        )


def test_release_predecessors_per_rule() -> None:
    changed = apply_barrier(fork_join(), [BarrierEdge("a1", "a2")])
    dag = release_predecessors(changed, ReleaseRule.DAG)
    barrier = release_predecessors(changed, ReleaseRule.BARRIER)
    assert dag == {"a1": (), "a2": (), "s": ("a1", "a2")}
    assert barrier == {"a1": (), "a2": ("a1",), "s": ("a1", "a2")}
    for rule in (ReleaseRule.FLAT, ReleaseRule.ARRIVAL):
        assert release_predecessors(changed, rule) == {"a1": (), "a2": (), "s": ()}


def test_release_plans() -> None:
    tr = make_trace(make_op("a", submitted_s=1.5), make_op("b", "a", submitted_s=4.0))
    dag = release_plan(tr, ReleaseRule.DAG)
    assert (dag.non_causal, dag.release_at_s) == (False, {"a": 1.0, "b": 1.0})
    flat = release_plan(tr, "flat")
    assert (flat.non_causal, flat.predecessors["b"]) == (True, ())
    arrival = release_plan(tr, ReleaseRule.ARRIVAL)
    assert (arrival.non_causal, arrival.release_at_s) == (True, {"a": 1.5, "b": 4.0})
    with pytest.raises(TraceValidationError, match="'a' has no submitted_s"):
        release_plan(fork_join().model_copy(update={"ops": [make_op("a")]}), "arrival")
    with pytest.raises(ValueError, match="'sideways' is not a valid ReleaseRule"):
        release_plan(tr, "sideways")


def test_check_legal_change_catches_dropped_and_illegal_edges() -> None:
    tr = fork_join()
    dropped = tr.model_copy(update={"ops": [make_op("a1"), make_op("a2"), make_op("s", "a1")]})
    with pytest.raises(IllegalReleaseError, match="drops required data edge a2 -> s"):
        check_legal_change(tr, dropped)
    data_added = tr.model_copy(update={"ops": [make_op("a1"), make_op("a2", "a1"), tr.ops[2]]})
    with pytest.raises(IllegalReleaseError, match="adds data edge a1 -> a2"):
        check_legal_change(tr, data_added)


@st.composite
def dags_with_barriers(draw: st.DrawFn) -> tuple[Trace, list[BarrierEdge]]:
    n = draw(st.integers(1, 7))
    ops = []
    for j in range(n):
        deps = [f"o{i}" for i in range(j) if draw(st.booleans())]
        ops.append(
            OpRecord(
                op_id=f"o{j}",
                root_id="r",
                kind=OpKind.MODEL,
                deps=tuple(
                    Dep(op_id=d, kind=EdgeKind.DATA, required=draw(st.booleans())) for d in deps
                ),
            )
        )
    edges = draw(
        st.lists(
            st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).map(
                lambda p: BarrierEdge(f"o{p[0]}", f"o{p[1]}")
            ),
            max_size=5,
        )
    )
    return make_trace(*ops), edges


@settings(max_examples=300, deadline=None)
@given(dags_with_barriers())
def test_barrier_is_legal_or_really_dependent_or_cyclic(
    case: tuple[Trace, list[BarrierEdge]],
) -> None:
    tr, edges = case
    g = nx.DiGraph()
    g.add_nodes_from(op.op_id for op in tr.ops)
    g.add_edges_from((d.op_id, op.op_id) for op in tr.ops for d in op.deps)
    g.add_edges_from((e.src_op, e.dst_op) for e in edges)
    recorded = nx.DiGraph()
    recorded.add_nodes_from(op.op_id for op in tr.ops)
    recorded.add_edges_from((d.op_id, op.op_id) for op in tr.ops for d in op.deps)
    dependent = any(
        nx.has_path(recorded, e.src_op, e.dst_op) or nx.has_path(recorded, e.dst_op, e.src_op)
        for e in edges
    )  # includes self edges
    try:
        changed = apply_barrier(tr, edges)
    except IllegalReleaseError:
        assert dependent or not nx.is_directed_acyclic_graph(g)
        return
    assert not dependent and nx.is_directed_acyclic_graph(g)
    check_legal_change(tr, changed)
    after = {(d.op_id, op.op_id, d.kind, d.required) for op in changed.ops for d in op.deps}
    before = {(d.op_id, op.op_id, d.kind, d.required) for op in tr.ops for d in op.deps}
    assert before <= after  # every recorded dep kept, required ones included
    barrier = release_predecessors(changed, ReleaseRule.BARRIER)
    for e in edges:
        assert e.src_op in barrier[e.dst_op]
    assert release_predecessors(changed, ReleaseRule.DAG) == release_predecessors(tr, "dag")
