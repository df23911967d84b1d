"""Tests for metrics.graph: depth, level widths, antichain width, peak in-flight."""

from __future__ import annotations

from itertools import combinations

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maserve_prefect.errors import TraceValidationError
from maserve_prefect.metrics.graph import (
    antichain_width,
    depth,
    level_widths,
    peak_in_flight,
    root_graph_stats,
    trace_graph_summary,
)
from maserve_prefect.trace.model import (
    Dep,
    EdgeKind,
    Manifest,
    OpKind,
    OpRecord,
    OpTimes,
    RootRecord,
    Trace,
)


def make_op(
    op_id: str,
    kind: OpKind = OpKind.MODEL,
    deps: tuple[str, ...] = (),
    times: tuple[float, float] | None = None,
    root: str = "r",
) -> OpRecord:
    return OpRecord(
        op_id=op_id,
        root_id=root,
        kind=kind,
        deps=tuple(Dep(op_id=d, kind=EdgeKind.DATA) for d in deps),
        times=OpTimes() if times is None else OpTimes(submitted_s=times[0], completed_s=times[1]),
    )


def make_trace(*ops: OpRecord) -> Trace:
    roots = [RootRecord(root_id=r) for r in dict.fromkeys(op.root_id for op in ops)]
    return Trace(manifest=Manifest(trace_id="t"), roots=roots, ops=list(ops))


def four_call_trace(with_tool: bool, root: str = "r") -> Trace:
    """The paper's graph: two analysts -> synthesis -> verification (optionally via a tool)."""
    p = f"{root}/"
    verify_dep = f"{p}tool" if with_tool else f"{p}syn"
    ops = [
        make_op(f"{p}a1", times=(0.0, 2.0), root=root),
        make_op(f"{p}a2", times=(1.0, 3.0), root=root),
        make_op(f"{p}syn", deps=(f"{p}a1", f"{p}a2"), times=(3.0, 4.0), root=root),
        make_op(f"{p}ver", deps=(verify_dep,), times=(4.5, 5.0), root=root),
    ]
    if with_tool:
        ops.insert(3, make_op(f"{p}tool", OpKind.TOOL, deps=(f"{p}syn",), root=root))
    return make_trace(*ops)


@pytest.mark.parametrize("with_tool", [False, True])
def test_four_call_graph(with_tool: bool) -> None:
    stats = root_graph_stats(four_call_trace(with_tool), "r")
    assert stats.num_ops == (5 if with_tool else 4)
    assert stats.num_calls == 4
    assert stats.depth == 3
    assert stats.antichain_width == 2
    assert stats.level_widths == (2, 1, 1)
    # a1 [0,2) and a2 [1,3) overlap; syn starts at 3 exactly when a2 completes.
    assert stats.peak_in_flight == 2


def test_larger_hand_computed_dag() -> None:
    # Calls: plan -> draft -> edit -> final (a chain), plan -> [search tool] -> cite,
    # draft -> critic, edit -> [lint tool] -> [transform] -> check -> final,
    # plus deps plan -> final and draft -> final. The reduction drops three of the 9 collapsed
    # call edges: plan -> final, draft -> final and edit -> final (implied by edit -> check -> final).
    tr = make_trace(
        make_op("plan"),
        make_op("draft", deps=("plan",)),
        make_op("search", OpKind.TOOL, deps=("plan",)),
        make_op("cite", deps=("search",)),
        make_op("critic", deps=("draft",)),
        make_op("edit", deps=("draft",)),
        make_op("lint", OpKind.TOOL, deps=("edit",)),
        make_op("fmt", OpKind.TRANSFORM, deps=("lint",)),
        make_op("check", deps=("fmt",)),
        make_op("final", deps=("edit", "check", "plan", "draft")),
    )
    stats = root_graph_stats(tr, "r")
    # Longest path plan -> draft -> edit -> check -> final: 5 calls.
    assert stats.depth == 5
    # Levels: plan 0 | draft, cite 1 | edit, critic 2 | check 3 | final 4.
    assert stats.level_widths == (1, 2, 2, 1, 1)
    # Chains {plan, draft, edit, check, final}, {cite}, {critic} cover all 7 calls and
    # {cite, critic, edit} is an antichain, so width 3 — wider than any level (2).
    assert stats.antichain_width == 3
    # Left: plan->draft, plan->cite, draft->edit, draft->critic, edit->check, check->final.
    assert stats.num_edges == 6
    assert (stats.num_ops, stats.num_calls) == (10, 7)
    assert stats.peak_in_flight is None  # no timestamps recorded


def test_empty_graph_metrics_are_zero() -> None:
    g = nx.DiGraph()
    assert (depth(g), level_widths(g), antichain_width(g)) == (0, [], 0)


def test_peak_in_flight_ties_and_empty_intervals() -> None:
    assert peak_in_flight([]) == 0
    # Completion at 1.0 precedes the submission at 1.0.
    assert peak_in_flight([(0.0, 1.0), (1.0, 2.0)]) == 1
    assert peak_in_flight([(0.0, 1.0), (0.5, 2.0), (0.9, 1.0)]) == 3
    # A zero-length interval is never in flight.
    assert peak_in_flight([(0.0, 2.0), (1.0, 1.0)]) == 1


def test_peak_in_flight_rejects_inverted_interval() -> None:
    with pytest.raises(TraceValidationError, match="completes before it is submitted"):
        peak_in_flight([(2.0, 1.0)])


def test_trace_summary_over_roots() -> None:
    a, b = four_call_trace(False, root="a"), four_call_trace(True, root="b")
    chain = make_trace(
        make_op("c/x", root="c"), make_op("c/y", deps=("c/x",), root="c")
    )  # depth 2, width 1, no timestamps
    tr = make_trace(*a.ops, *b.ops, *chain.ops)
    s = trace_graph_summary(tr)
    assert s.num_roots == 3
    assert [r.root_id for r in s.per_root] == ["a", "b", "c"]
    assert (s.depth.max, s.depth.p50) == (3.0, 3.0)
    assert s.depth.mean == pytest.approx(8 / 3)
    assert (s.antichain_width.mean, s.antichain_width.max) == (pytest.approx(5 / 3), 2.0)
    # Only roots a and b have timestamps.
    assert s.peak_in_flight is not None and s.peak_in_flight.max == 2.0


@st.composite
def small_dags(draw: st.DrawFn) -> nx.DiGraph:
    n = draw(st.integers(0, 8))
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    for j in range(n):
        for i in range(j):
            if draw(st.booleans()):
                g.add_edge(i, j)
    return g


def brute_force_antichain(g: nx.DiGraph) -> int:
    closure = nx.transitive_closure_dag(g)
    nodes = list(g.nodes)
    for size in range(len(nodes), 0, -1):
        for subset in combinations(nodes, size):
            if all(
                not closure.has_edge(u, v) and not closure.has_edge(v, u)
                for u, v in combinations(subset, 2)
            ):
                return size
    return 0


@settings(max_examples=200, deadline=None)
@given(small_dags())
def test_antichain_width_matches_brute_force(g: nx.DiGraph) -> None:
    assert antichain_width(g) == brute_force_antichain(g)


@settings(max_examples=100, deadline=None)
@given(small_dags())
def test_levels_partition_nodes_and_match_depth(g: nx.DiGraph) -> None:
    widths = level_widths(g)
    assert sum(widths) == g.number_of_nodes()
    assert len(widths) == depth(g)
    assert all(w > 0 for w in widths)
    # Every level is an antichain, so no level is wider than the maximum antichain.
    assert max(widths, default=0) <= antichain_width(g)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 5)), max_size=12))
def test_peak_in_flight_matches_pointwise_count(raw: list[tuple[int, int]]) -> None:
    intervals = [(float(s), float(s + d)) for s, d in raw]
    # Half-open intervals with integer ends: the count is piecewise constant on [k, k+1).
    pointwise = max(
        (sum(s <= t < e for s, e in intervals) for t in range(0, 26)),
        default=0,
    )
    assert peak_in_flight(intervals) == pointwise
