"""Tests for trace.validate: each invariant, messages naming ops and lines, property tests."""

from __future__ import annotations

from itertools import pairwise

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maserve_prefect.errors import TraceValidationError
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.model import (
    Dep,
    EdgeKind,
    Manifest,
    OpKind,
    OpRecord,
    RootRecord,
    StageRecord,
    Trace,
)
from maserve_prefect.trace.validate import MAX_LISTED_PROBLEMS, find_problems, validate_trace


def make_trace(
    edges: list[tuple[int, int]], num_ops: int, store: MemoryStore | None = None
) -> Trace:
    """Ops `o0..o{n-1}` of root `r`; edge (i, j) makes `oj` consume `oi`'s output (a data dep)."""
    store = store if store is not None else MemoryStore()
    deps: dict[int, list[Dep]] = {j: [] for j in range(num_ops)}
    for i, j in edges:
        deps[j].append(Dep(op_id=f"o{i}", kind=EdgeKind.DATA))
    ops = [
        OpRecord(
            op_id=f"o{j}",
            root_id="r",
            kind=OpKind.MODEL,
            deps=tuple(deps[j]),
            output_ref=store.put(f"output of o{j}".encode()),
        )
        for j in range(num_ops)
    ]
    return Trace(manifest=Manifest(trace_id="t"), roots=[RootRecord(root_id="r")], ops=ops)


def with_ops(trace: Trace, *ops: OpRecord) -> Trace:
    return trace.model_copy(update={"ops": [*trace.ops, *ops]})


def test_a_valid_trace_has_no_problems() -> None:
    store = MemoryStore()
    trace = make_trace([(0, 1), (0, 2), (1, 3), (2, 3)], 4, store)
    assert find_problems(trace, store) == []
    validate_trace(trace, store)


def test_dangling_dep_names_the_op_and_the_line() -> None:
    bad = OpRecord(
        op_id="o9", root_id="r", kind=OpKind.TOOL, deps=(Dep(op_id="ghost", kind=EdgeKind.CONTROL),)
    )
    trace = with_ops(make_trace([], 2), bad)
    with pytest.raises(TraceValidationError) as err:
        validate_trace(trace, source="b/trace.jsonl", op_lines={("o9", 1): 4})
    assert "b/trace.jsonl:4: op 'o9': depends on 'ghost', which is not an op of the trace" in str(
        err.value
    )


def test_duplicate_op_attempt_and_duplicate_root_are_reported() -> None:
    trace = make_trace([], 2)
    trace = trace.model_copy(update={"roots": [*trace.roots, RootRecord(root_id="r")]})
    trace = with_ops(trace, trace.ops[0])
    messages = [p.render() for p in find_problems(trace)]
    assert "root id 'r' is used 2 times; ids must be unique" in messages
    assert any(m.startswith("op 'o0': duplicate (op_id, attempt)") for m in messages)


def test_retry_is_not_a_duplicate() -> None:
    trace = make_trace([], 1)
    retry = trace.ops[0].model_copy(update={"attempt": 2})
    assert find_problems(with_ops(trace, retry)) == []


def test_unknown_root_for_op_and_stage() -> None:
    trace = with_ops(make_trace([], 1), OpRecord(op_id="x", root_id="nope", kind=OpKind.TOOL))
    trace = trace.model_copy(
        update={"stages": [StageRecord(stage_id="s", root_id="nope", name="n")]}
    )
    messages = [p.render() for p in find_problems(trace)]
    assert "stage 's' names unknown root 'nope'" in messages
    assert "op 'x': names root 'nope', which has no root record" in messages


def test_data_edge_without_output_payload() -> None:
    trace = make_trace([], 1)
    producer = OpRecord(op_id="p", root_id="r", kind=OpKind.TOOL)
    consumer = OpRecord(
        op_id="c", root_id="r", kind=OpKind.MODEL, deps=(Dep(op_id="p", kind=EdgeKind.DATA),)
    )
    control_only = OpRecord(
        op_id="k", root_id="r", kind=OpKind.MODEL, deps=(Dep(op_id="p", kind=EdgeKind.CONTROL),)
    )
    problems = find_problems(with_ops(trace, producer, consumer, control_only))
    assert [p.render() for p in problems] == [
        "op 'c': has a data dependency on 'p', which has no output payload"
    ]


def test_blob_missing_from_store_is_reported_only_when_a_store_is_given() -> None:
    trace = make_trace([(0, 1)], 2)  # outputs were put into a throwaway store
    assert find_problems(trace) == []
    problems = find_problems(trace, MemoryStore())
    assert {(p.op_id, "not in the store" in p.message) for p in problems} == {
        ("o0", True),
        ("o1", True),
    }


def test_many_problems_are_counted_beyond_the_listed_ones() -> None:
    n = MAX_LISTED_PROBLEMS + 5
    ghosts = [
        OpRecord(
            op_id=f"g{i}",
            root_id="r",
            kind=OpKind.TOOL,
            deps=(Dep(op_id="missing", kind=EdgeKind.CONTROL),),
        )
        for i in range(n)
    ]
    with pytest.raises(TraceValidationError) as err:
        validate_trace(with_ops(make_trace([], 1), *ghosts))
    text = str(err.value)
    assert f"({n} problems)" in text and "... and 5 more" in text
    assert text.count("depends on 'missing'") == MAX_LISTED_PROBLEMS


@st.composite
def random_dags(draw: st.DrawFn) -> tuple[int, list[tuple[int, int]]]:
    n = draw(st.integers(min_value=2, max_value=12))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=len(pairs)))
    # Shuffle op numbering so topological order is not the id order.
    perm = draw(st.permutations(range(n)))
    return n, [(perm[i], perm[j]) for i, j in edges]


@settings(max_examples=60, deadline=None)
@given(random_dags())
def test_random_dags_validate(dag: tuple[int, list[tuple[int, int]]]) -> None:
    n, edges = dag
    store = MemoryStore()
    validate_trace(make_trace(edges, n, store), store)


@settings(max_examples=60, deadline=None)
@given(random_dags(), st.data())
def test_closing_a_path_into_a_cycle_is_reported_naming_the_cycle(
    dag: tuple[int, list[tuple[int, int]]], data: st.DataObject
) -> None:
    n, edges = dag
    graph = nx.DiGraph(edges)
    reachable = [(u, v) for u in graph for v in nx.descendants(graph, u)]
    if not reachable:
        edges, reachable = [*edges, (0, 1)], [(0, 1)]
    u, v = data.draw(st.sampled_from(reachable))
    trace = make_trace([*edges, (v, u)], n)  # u now also depends on its descendant v
    with pytest.raises(TraceValidationError, match="cycle") as err:
        validate_trace(trace)
    cycle_msg = next(line for line in str(err.value).splitlines() if "cycle" in line)
    named = cycle_msg.split("has a cycle: ", 1)[1].split(";")[0]
    ops_on_cycle = [s.strip(" '") for s in named.split("->")]
    assert ops_on_cycle[0] == ops_on_cycle[-1]
    cycle_edges = list(pairwise(ops_on_cycle))
    all_edges = {(f"o{i}", f"o{j}") for i, j in [*edges, (v, u)]}
    assert set(cycle_edges) <= all_edges
    # The DAG had no cycle, so every cycle runs through the added edge.
    assert (f"o{v}", f"o{u}") in cycle_edges
