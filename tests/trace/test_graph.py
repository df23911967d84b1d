"""Tests for trace.graph: op graphs and the collapsed LLM-call graph."""

from __future__ import annotations

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maserve_prefect.errors import TraceValidationError
from maserve_prefect.trace.graph import llm_graph, op_graph, root_op_graphs
from maserve_prefect.trace.model import (
    Dep,
    EdgeKind,
    Manifest,
    OpKind,
    OpRecord,
    OpStatus,
    RootRecord,
    Trace,
)


def make_op(op_id: str, kind: OpKind = OpKind.MODEL, *deps: str | Dep, root: str = "r") -> OpRecord:
    return OpRecord(
        op_id=op_id,
        root_id=root,
        kind=kind,
        deps=tuple(d if isinstance(d, Dep) else Dep(op_id=d, kind=EdgeKind.DATA) for d in deps),
    )


def make_trace(*ops: OpRecord) -> Trace:
    roots = list(dict.fromkeys(op.root_id for op in ops))
    return Trace(
        manifest=Manifest(trace_id="t"),
        roots=[RootRecord(root_id=r) for r in roots],
        ops=list(ops),
    )


def test_op_graph_nodes_edges_and_attributes() -> None:
    tr = make_trace(
        make_op("a"),
        make_op("t", OpKind.TOOL, "a"),
        make_op("b", OpKind.MODEL, "t", Dep(op_id="a", kind=EdgeKind.CONTROL, required=False)),
    )
    g = op_graph(tr)
    assert sorted(g.edges()) == [("a", "b"), ("a", "t"), ("t", "b")]
    assert g.nodes["t"]["kind"] == OpKind.TOOL
    assert g.edges["a", "b"]["kind"] == EdgeKind.CONTROL
    assert g.edges["a", "b"]["required"] is False


def test_parallel_deps_merge_to_strongest_kind_and_any_required() -> None:
    b = make_op(
        "b",
        OpKind.MODEL,
        Dep(op_id="a", kind=EdgeKind.CONTROL, required=False),
        Dep(op_id="a", kind=EdgeKind.DATA, required=True),
    )
    g = op_graph(make_trace(make_op("a"), b))
    edge = g.edges["a", "b"]
    assert edge["kind"] == EdgeKind.DATA
    assert set(edge["kinds"]) == {EdgeKind.CONTROL, EdgeKind.DATA}
    assert edge["required"] is True


def test_retried_op_uses_last_attempt() -> None:
    first = OpRecord(op_id="a", root_id="r", kind=OpKind.MODEL, status=OpStatus.FAILED)
    second = OpRecord(op_id="a", root_id="r", kind=OpKind.MODEL, attempt=2)
    g = op_graph(make_trace(first, second))
    assert g.number_of_nodes() == 1
    assert g.nodes["a"]["record"].attempt == 2


def test_dangling_dep_names_both_ops() -> None:
    with pytest.raises(TraceValidationError, match=r"'b' depends on 'ghost'"):
        op_graph(make_trace(make_op("b", OpKind.MODEL, "ghost")))


def test_root_filter_and_unknown_root() -> None:
    tr = make_trace(make_op("x/a", root="x"), make_op("y/a", root="y"))
    assert list(op_graph(tr, "y").nodes) == ["y/a"]
    with pytest.raises(TraceValidationError, match="root 'z' is not in trace"):
        op_graph(tr, "z")


def test_root_op_graphs_groups_every_root_in_order() -> None:
    tr = make_trace(make_op("x/a", root="x"), make_op("y/a", root="y"), make_op("x/b", root="x"))
    tr.roots.append(RootRecord(root_id="empty"))
    got = {r: sorted(g.nodes) for r, g in root_op_graphs(tr)}
    assert list(got) == ["x", "y", "empty"]
    assert got == {"x": ["x/a", "x/b"], "y": ["y/a"], "empty": []}


def test_llm_graph_collapses_tool_path_and_reduces() -> None:
    # a -> tool -> transform -> b, plus a direct a -> c and b -> c: a -> c is transitive.
    tr = make_trace(
        make_op("a"),
        make_op("t", OpKind.TOOL, "a"),
        make_op("x", OpKind.TRANSFORM, "t"),
        make_op("b", OpKind.MODEL, "x"),
        make_op("c", OpKind.MODEL, "a", "b"),
    )
    g = llm_graph(op_graph(tr))
    assert sorted(g.nodes) == ["a", "b", "c"]
    assert sorted(g.edges()) == [("a", "b"), ("b", "c")]
    assert g.edges["a", "b"]["collapsed"] is True
    assert g.edges["b", "c"]["collapsed"] is False
    assert g.nodes["a"]["kind"] == OpKind.MODEL


def test_llm_graph_does_not_pass_through_model_ops() -> None:
    # a -> b -> c all models: a must not get a direct edge to c.
    tr = make_trace(make_op("a"), make_op("b", OpKind.MODEL, "a"), make_op("c", OpKind.MODEL, "b"))
    assert sorted(llm_graph(op_graph(tr)).edges()) == [("a", "b"), ("b", "c")]


def test_llm_graph_rejects_cycle_naming_ops() -> None:
    tr = make_trace(make_op("a", OpKind.MODEL, "b"), make_op("b", OpKind.TOOL, "a"))
    with pytest.raises(TraceValidationError, match="cycle"):
        llm_graph(op_graph(tr))


@st.composite
def random_op_dags(draw: st.DrawFn) -> nx.DiGraph:
    n = draw(st.integers(1, 9))
    kinds = draw(st.lists(st.sampled_from([OpKind.MODEL, OpKind.TOOL]), min_size=n, max_size=n))
    g = nx.DiGraph()
    for i, kind in enumerate(kinds):
        g.add_node(str(i), kind=kind)
    for j in range(n):
        for i in range(j):
            if draw(st.booleans()):
                g.add_edge(str(i), str(j))
    return g


@settings(max_examples=150, deadline=None)
@given(random_op_dags())
def test_llm_graph_keeps_reachability_between_model_ops(g: nx.DiGraph) -> None:
    reduced = llm_graph(g)
    models = [n for n, k in g.nodes(data="kind") if k == OpKind.MODEL]
    assert sorted(reduced.nodes) == sorted(models)
    for u in models:
        for v in models:
            if u != v:
                assert nx.has_path(reduced, u, v) == nx.has_path(g, u, v)
    # Transitively reduced: no edge is implied by another path.
    for u, v in list(reduced.edges()):
        h = reduced.copy()
        h.remove_edge(u, v)
        assert not nx.has_path(h, u, v)
