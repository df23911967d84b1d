"""Property tests of validation: random DAGs pass; cycles, non-positive bounds and over-wide
joins always fail with a SpecError naming the problem."""

from __future__ import annotations

import itertools
import re
from typing import Any

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from spec_factories import make_dag_data, make_workload

from maserve_prefect.errors import SpecError
from maserve_prefect.spec.composition import Parallel, Repeat, StageRef
from maserve_prefect.spec.memory import MemoryNamespace
from maserve_prefect.spec.rules import JoinRule
from maserve_prefect.spec.templates import (
    DebateConfig,
    ForkJoinConfig,
    RefinementLoopConfig,
    SpawnConfig,
)

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def dags(draw: st.DrawFn) -> tuple[int, list[tuple[int, int]]]:
    """A stage count and forward edges i -> j (i < j): always acyclic."""
    n = draw(st.integers(min_value=1, max_value=8))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = draw(st.lists(st.sampled_from(pairs), unique=True)) if pairs else []
    return n, sorted(edges)


@SETTINGS
@given(dags(), st.booleans())
def test_random_dags_validate(dag: tuple[int, list[tuple[int, int]]], sequential: bool) -> None:
    n, edges = dag
    data = make_dag_data(n, edges)
    if sequential:
        data["composition"] = {"kind": "sequence", "steps": [f"s{i}" for i in range(n)]}
    spec = make_workload(data)
    order = spec.topological_stages()
    position = {name: i for i, name in enumerate(order)}
    assert sorted(order) == sorted(f"s{i}" for i in range(n))
    assert all(position[f"s{i}"] < position[f"s{j}"] for i, j in edges)


@st.composite
def dags_with_back_edge(draw: st.DrawFn) -> tuple[int, list[tuple[int, int]], tuple[int, int]]:
    """A DAG with at least one path u ~> v, and the back edge v -> u that closes a cycle."""
    n, edges = draw(dags().filter(lambda d: bool(d[1])))
    graph = nx.DiGraph(edges)
    reachable = sorted((u, v) for u in graph for v in nx.descendants(graph, u))
    u, v = draw(st.sampled_from(reachable))
    return n, edges, (v, u)


@SETTINGS
@given(dags_with_back_edge())
def test_back_edge_always_raises_naming_a_real_cycle(
    case: tuple[int, list[tuple[int, int]], tuple[int, int]],
) -> None:
    n, edges, (v, u) = case
    data = make_dag_data(n, edges)
    data["dependencies"].append({"source": f"s{v}", "target": f"s{u}"})
    with pytest.raises(SpecError) as info:
        make_workload(data)
    match = re.search(r"dependency cycle: ([\w >-]+?) \(", str(info.value))
    assert match is not None, str(info.value)
    path = match.group(1).split(" -> ")
    assert path[0] == path[-1] and len(path) >= 3
    closed = {*((f"s{i}", f"s{j}") for i, j in edges), (f"s{v}", f"s{u}")}
    assert all((a, b) in closed for a, b in itertools.pairwise(path))


NON_POSITIVE = st.integers(max_value=0)


def _bound_cases(bad: int) -> list[tuple[str, Any]]:
    return [
        ("width", lambda: ForkJoinConfig(worker_role="w", width=bad)),
        (
            "max_rounds",
            lambda: RefinementLoopConfig(generator_role="g", evaluator="binding", max_rounds=bad),
        ),
        ("rounds", lambda: DebateConfig(peers=("a", "b"), rounds=bad)),
        ("num_children", lambda: SpawnConfig(parent_role="p", child_role="c", num_children=bad)),
        (
            "max_children",
            lambda: SpawnConfig(
                parent_role="p", child_role="c", children="decided", max_children=bad
            ),
        ),
        ("max_iterations", lambda: Repeat(body=StageRef(stage="a"), max_iterations=bad)),
        ("k", lambda: JoinRule(rule="k_of_n", k=bad)),
        (
            "max_versions",
            lambda: MemoryNamespace(
                name="m", scope="shared_versioned", readers=("a",), max_versions=bad
            ),
        ),
    ]


@SETTINGS
@given(NON_POSITIVE, st.integers(min_value=0, max_value=7))
def test_non_positive_bounds_always_raise(bad: int, which: int) -> None:
    field, build = _bound_cases(bad)[which]
    with pytest.raises(
        SpecError, match=rf"\b{field}: Input should be greater than or equal to 1 \(got {bad}\)"
    ):
        build()


@SETTINGS
@given(NON_POSITIVE)
def test_non_positive_bound_in_a_file_names_the_stage(bad: int) -> None:
    data = make_dag_data(1, [])
    data["stages"][0]["control"] = {"kind": "debate", "peers": ["s0", "s0b"], "rounds": bad}
    data["stages"][0]["participants"].append({"role": "s0b", "deployment": "m"})
    with pytest.raises(
        SpecError, match=rf"stages\[0\] \('s0'\)\.control \(debate\)\.rounds: .*\(got {bad}\)"
    ):
        make_workload(data)


@SETTINGS
@given(st.integers(min_value=1, max_value=6), st.integers(min_value=1, max_value=12))
def test_join_k_versus_width(width: int, k: int) -> None:
    join = JoinRule(rule="k_of_n", k=k)
    builds = [
        (
            lambda: Parallel(
                branches=tuple(StageRef(stage=f"b{i}") for i in range(width)), join=join
            ),
            "branches",
        ),
        (lambda: ForkJoinConfig(worker_role="w", width=width, sync=join), "workers"),
        (
            lambda: SpawnConfig(
                parent_role="p", child_role="c", num_children=width, completion=join
            ),
            "children",
        ),
        (
            lambda: SpawnConfig(
                parent_role="p",
                child_role="c",
                children="decided",
                max_children=width,
                completion=join,
            ),
            "children",
        ),
    ]
    for build, what in builds:
        if k > width:
            with pytest.raises(SpecError, match=f"join k={k} is wider than its {width} {what}"):
                build()
        else:
            assert build() is not None
