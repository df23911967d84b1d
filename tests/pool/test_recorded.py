"""Native traces as pool work: model ops → units, non-model ops collapsed, documented models."""

from __future__ import annotations

import networkx as nx
import pytest

from maserve_prefect.bench.pool.traces import record_traces
from maserve_prefect.errors import ConfigError
from maserve_prefect.pool.recorded import (
    POOL_MODELS,
    WORKFLOWS,
    ArrivalPattern,
    RootWork,
    build_root_dags,
    convert_trace,
    session_key,
)
from maserve_prefect.trace.model import (
    Dep,
    EdgeKind,
    GenerationSettings,
    Manifest,
    OpKind,
    OpRecord,
    OpStatus,
    Trace,
)

USERS, SEED = 4, 42  # the demo scale of deployments/suites/pool_hetero.yaml (shares the cache)

EXPECTED_MODELS = {
    "math_ensemble": {
        "solve.worker0": "Qwen3-14B",
        "solve.worker1": "Qwen3-8B",
        "solve.worker2": "Qwen3-4B",
        "solve.worker3": "Qwen3-1.7B",
        "solve.worker4": "Qwen3-0.6B",
        "refine.writer": "Qwen3-14B",
    },
    "code_repair": {
        "generate.coder": "Qwen3-8B",
        "diagnose.diagnoser": "Qwen3-1.7B",
        "review.reviewer": "Qwen3-14B",
        "repair.repairer": "Qwen3-4B",
        "validate.validator": "Qwen3-0.6B",
    },
    "hierarchical_summary": {
        **{f"chain_a{i}.summarizer": "Qwen3-4B" for i in (1, 2, 3)},
        **{f"chain_b{i}.summarizer": "Qwen3-4B" for i in (1, 2, 3)},
        "merge.aggregator": "Qwen3-8B",
        "answer.writer": "Qwen3-8B",
        "edit.editor": "Qwen3-8B",
    },
}


@pytest.fixture(scope="module")
def traces(prefect_api: None) -> dict[str, Trace]:
    return record_traces(WORKFLOWS, USERS, SEED)


def _graph(trace: Trace) -> nx.DiGraph:
    g = nx.DiGraph()
    for op in trace.ops:
        g.add_node(op.op_id, model=op.kind is OpKind.MODEL)
        for d in op.deps:
            if d.required:
                g.add_edge(d.op_id, op.op_id)
    return g


def _expected_preds(g: nx.DiGraph, b: str) -> set[str]:
    """Model ops with a path to `b` whose inner nodes are all non-model (networkx, brute force)."""
    inner = [n for n in g if not g.nodes[n]["model"]]
    out = set()
    for a in g:
        if a != b and g.nodes[a]["model"] and nx.has_path(g.subgraph([*inner, a, b]), a, b):
            out.add(a)
    return out


def test_units_are_the_model_ops_with_non_model_ops_collapsed(traces: dict[str, Trace]) -> None:
    for name, trace in traces.items():
        roots = convert_trace(trace, name)
        units = {u.unit_id: u for r in roots for u in r.units}
        model_ops = {op.op_id: op for op in trace.ops if op.kind is OpKind.MODEL}
        assert len(roots) == USERS
        assert set(units) == {f"{name}/{i}" for i in model_ops}
        g = _graph(trace)
        ug = nx.DiGraph()
        ug.add_nodes_from(units)
        for uid, u in units.items():
            op = model_ops[uid.removeprefix(f"{name}/")]
            assert (u.input_len, u.max_tokens) == (op.num_input_tokens, op.num_output_tokens)
            expected = {f"{name}/{p}" for p in _expected_preds(g, op.op_id)}
            assert set(u.preds) == expected, uid
            for s in u.succs:
                assert uid in units[s].preds
            ug.add_edges_from((p, uid) for p in u.preds)
        # transitive model-to-model dependencies are exactly the trace's
        for op_id in model_ops:
            traced = {a for a in nx.ancestors(g, op_id) if a in model_ops}
            assert {a.removeprefix(f"{name}/") for a in nx.ancestors(ug, f"{name}/{op_id}")} == (
                traced
            )


def test_logical_deployments_map_to_the_documented_models(traces: dict[str, Trace]) -> None:
    used = set()
    for name, trace in traces.items():
        ops = {op.op_id: op for op in trace.ops}
        for root in convert_trace(trace, name):
            for u in root.units:
                key = session_key(ops[u.unit_id.removeprefix(f"{name}/")])
                assert u.deployment == EXPECTED_MODELS[name][key], (name, key)
                used.add(u.deployment)
    assert used == set(POOL_MODELS)


def test_tool_time_is_folded_into_edges_and_reported(traces: dict[str, Trace]) -> None:
    trace = traces["code_repair"]
    tools: dict[str, float] = {}
    for op in trace.ops:
        if op.kind is OpKind.TOOL:
            tools[op.root_id] = tools.get(op.root_id, 0.0) + (op.tool_duration_s or 0.0)
    roots = convert_trace(trace, "code_repair")
    assert {r.root_id: r.folded_delay_s for r in roots} == {
        f"code_repair/{k}": pytest.approx(v) for k, v in tools.items()
    }
    assert all(r.folded_delay_s > 0 for r in roots)  # every root runs the tests at least once


def _op(i: str, kind: OpKind, deps: tuple[str, ...] = (), **kw: object) -> OpRecord:
    dep = tuple(Dep(op_id=f"r0/{d}", kind=EdgeKind.DATA) for d in deps)
    if kind is OpKind.MODEL:
        kw.setdefault("generation", GenerationSettings(deployment="main"))
        kw.setdefault("num_input_tokens", 10)
        kw.setdefault("num_output_tokens", 4)
    return OpRecord(op_id=f"r0/{i}", root_id="r0", kind=kind, session_id=f"r0/{i}.x", deps=dep,
                    **kw)  # type: ignore[arg-type]  # fmt: skip


def test_diamonds_of_non_model_ops_and_optional_deps() -> None:
    ops = [
        _op("a", OpKind.MODEL),
        _op("c", OpKind.MODEL),
        _op("t1", OpKind.TOOL, ("a",), tool_duration_s=2.0),
        _op("t2", OpKind.TRANSFORM, ("t1",)),
        _op("t3", OpKind.STATE_READ, ("t1", "c")),
        _op("t4", OpKind.TRANSFORM, ("t2", "t3")),
        _op("b", OpKind.MODEL, ("t4",)),
    ]
    optional = Dep(op_id="r0/b", kind=EdgeKind.CONTROL, required=False)
    ops.append(_op("d", OpKind.MODEL).model_copy(update={"deps": (optional,)}))
    trace = Trace(manifest=Manifest(trace_id="t"), ops=ops)
    [root] = convert_trace(trace, "w", {"main": "Qwen3-8B"})
    preds = {u.unit_id: u.preds for u in root.units}
    assert preds == {"w/r0/a": (), "w/r0/b": ("w/r0/a", "w/r0/c"), "w/r0/c": (), "w/r0/d": ()}
    assert root.num_folded_ops == 4 and root.folded_delay_s == 2.0
    assert {u.unit_id: u.succs for u in root.units}["w/r0/a"] == ("w/r0/b",)


def test_conversion_errors_name_the_op_and_the_fix() -> None:
    failed = _op("a", OpKind.MODEL, status=OpStatus.FAILED)
    with pytest.raises(ConfigError, match=r"'r0/a'.*never completed"):
        convert_trace(Trace(manifest=Manifest(trace_id="t"), ops=[failed]), "w", {})
    trace = Trace(manifest=Manifest(trace_id="t"), ops=[_op("a", OpKind.MODEL)])
    with pytest.raises(ConfigError, match=r"'r0/a'.*deployment 'main'"):
        convert_trace(trace, "w", {"large": "Qwen3-14B"})
    with pytest.raises(ConfigError, match=r"notes\.pool"):
        convert_trace(trace, "w")


def _roots(n: int) -> list[RootWork]:
    return [RootWork(f"w{i % 3}/r{i}", f"w{i % 3}", (), 0, 0.0) for i in range(n)]


def test_arrivals_are_seeded_by_run() -> None:
    roots = _roots(9)
    burst = build_root_dags(roots, ArrivalPattern("burst"), run=0)
    assert [wf.arrival_s for wf in burst] == [0.0] * 9
    p0 = build_root_dags(roots, ArrivalPattern("poisson", 0.15), run=0)
    assert p0 == build_root_dags(roots, ArrivalPattern("poisson", 0.15), run=0)
    p1 = build_root_dags(roots, ArrivalPattern("poisson", 0.15), run=1)
    times = [wf.arrival_s for wf in p0]
    assert times[0] == 0.0 and times == sorted(times) and times != [wf.arrival_s for wf in p1]
    assert sorted(wf.root_id for wf in p0) == sorted(r.root_id for r in roots)
    assert [wf.root_id for wf in p0] != sorted(r.root_id for r in roots)  # workflows mixed
    with pytest.raises(ConfigError, match="rate_per_s > 0"):
        ArrivalPattern("poisson")


def test_each_scenario_arrives_at_the_rate_on_its_own() -> None:
    """The paper's per-scenario rates: every workflow is its own Poisson process at the rate, so
    the pool sees three times the rate and each scenario's gaps average 1 / rate."""
    roots = _roots(600)
    dags = build_root_dags(roots, ArrivalPattern("poisson", 0.15), run=0)
    for wf in ("w0", "w1", "w2"):
        times = [d.arrival_s for d in dags if d.name == wf]
        assert len(times) == 200 and times[0] == 0.0
        mean_gap = times[-1] / (len(times) - 1)
        assert 0.8 / 0.15 < mean_gap < 1.2 / 0.15, (wf, mean_gap)
    span = max(d.arrival_s for d in dags)
    assert 0.8 * 3 * 0.15 < len(dags) / span < 1.2 * 3 * 0.15
    # the scenarios draw independently: not the same offsets three times
    per_wf = [tuple(d.arrival_s for d in dags if d.name == wf) for wf in ("w0", "w1")]
    assert per_wf[0] != per_wf[1]
