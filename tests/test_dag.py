"""dag.topological_order: the one topological order, checked against networkx's."""

from __future__ import annotations

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maserve_prefect.dag import topological_order


@st.composite
def dags(draw: st.DrawFn) -> tuple[list[int], list[tuple[int, int]], dict[int, int]]:
    n = draw(st.integers(0, 12))
    nodes = draw(st.permutations(list(range(n))))
    pairs = [(u, v) for u in range(n) for v in range(u + 1, n)]  # u < v: acyclic
    edges = draw(st.lists(st.sampled_from(pairs), unique=True)) if pairs else []
    keys = {v: draw(st.integers(0, 3)) for v in range(n)}  # ties are common
    return list(nodes), edges, keys


@settings(max_examples=200, deadline=None)
@given(dags())
def test_same_order_as_networkx_lexicographical_sort(dag) -> None:  # type: ignore[no-untyped-def]
    nodes, edges, keys = dag
    g: nx.DiGraph[int] = nx.DiGraph()
    g.add_nodes_from(nodes)
    g.add_edges_from(edges)
    expected = list(nx.lexicographical_topological_sort(g, key=lambda v: keys[v]))
    assert topological_order(nodes, edges, key=keys.__getitem__) == expected
    position = {v: i for i, v in enumerate(expected)}
    assert all(position[u] < position[v] for u, v in edges)


def test_unknown_nodes_and_cycles_are_value_errors() -> None:
    with pytest.raises(ValueError, match="not in the graph"):
        topological_order(["a"], [("a", "b")])
    with pytest.raises(ValueError, match=r"cycle through \['b', 'c'\]"):
        topological_order(["a", "b", "c"], [("a", "b"), ("b", "c"), ("c", "b")])
