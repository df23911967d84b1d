"""Finding 1 (legal control at fixed work): the suite follows the paper's protocol, its figures.

The suite (`finding_barrier.yaml`) replays frozen four-call Full / Selected traces and frozen
GPT-Researcher-sized Full captures under DAG and Barrier; `bench.replay.finding_f1` reads the
scheduled width (antichain width of each root's release graph, summed over the roots), the peak
in flight and the mean root latency change. Widths are checked on hand-made traces where the
answer is known by construction; the demo run checks what the mechanism guarantees (Barrier
only adds waits; its width is the roots, not the branches) and recomputes the rest from the
replay traces. Nothing asserts a wall-clock time.
"""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

from maserve_prefect.bench.flow import run_suite
from maserve_prefect.bench.replay import finding_f1
from maserve_prefect.bench.replay.finding_f1 import (
    mean_latency_change_pct,
    peak_in_flight,
    scheduled_width,
)
from maserve_prefect.bench.replay.paper import PAPER_COLUMNS
from maserve_prefect.bench.replay.suite import ReplaySuiteResult
from maserve_prefect.bench.replay.suite_file import ReplaySuite
from maserve_prefect.bench.suite import load_suite
from maserve_prefect.errors import IllegalReleaseError
from maserve_prefect.replay.arms import arm_barrier
from maserve_prefect.replay.scenario import Explicit
from maserve_prefect.trace.barrier import BarrierEdge, StageBarrier, apply_barrier
from maserve_prefect.trace.model import (
    Dep,
    EdgeKind,
    Manifest,
    OpKind,
    OpRecord,
    OpTimes,
    Trace,
)

SUITE = Path(__file__).resolve().parents[2] / "deployments" / "suites" / "finding_barrier.yaml"


def _suite() -> ReplaySuite:
    suite = load_suite(SUITE)
    assert isinstance(suite, ReplaySuite)
    return suite


# -- the protocol ------------------------------------------------------------------------------


def test_full_scale_is_the_papers_protocol() -> None:
    scenarios = {s.name: s for s in _suite().load_scenarios("full")}
    assert set(scenarios) == {"f1-barrier", "f1-barrier-selected", "f1-barrier-research"}
    for name, workflow in (
        ("f1-barrier", "four_call_full"),
        ("f1-barrier-selected", "four_call_selected"),
    ):
        sc = scenarios[name]
        (cohort,) = sc.cohorts
        assert cohort.native is not None and cohort.native.workflow == workflow
        assert (cohort.native.users, cohort.native.seed, sc.blocks) == (12, 0, 3)
        assert {a.pool.name for a in sc.arms if a.pool} == {"pool_910c_qwen3_8b.yaml"}
        (barrier,) = [a for a in sc.arms if a.name == "barrier"]
        # the four-call has two analysts: one edge orders all of them
        assert [b.to_release() for b in barrier.barrier] == [StageBarrier("analyst_a", "analyst_b")]
    research = scenarios["f1-barrier-research"]
    (cohort,) = research.cohorts
    assert cohort.native is not None and cohort.native.workflow == "gpt_researcher_full"
    assert (cohort.native.users, research.blocks) == (3, 3)
    assert isinstance(research.arrivals, Explicit) and research.arrivals.times_s == (0.0, 0.1, 0.2)
    assert {a.pool.name for a in research.arms if a.pool} == {"pool_rtxpro5000_qwen3_8b.yaml"}
    (barrier,) = [a for a in research.arms if a.name == "barrier"]
    assert [b.to_release() for b in barrier.barrier] == [
        StageBarrier("refine_a", "query_b"),
        StageBarrier("refine_b", "query_c"),
    ]


def test_demo_scale_keeps_the_structure_with_fewer_roots() -> None:
    for sc in _suite().load_scenarios("demo"):
        (cohort,) = sc.cohorts
        assert cohort.native is not None and sc.blocks == 1
        assert cohort.native.users == (3 if sc.name == "f1-barrier-research" else 4)
        assert [a.name for a in sc.arms] == ["dag", "barrier"]


# -- scheduled width and peak in flight on hand-made traces -------------------------------------


def _op(root: str, name: str, *deps: str, kind: OpKind = OpKind.MODEL) -> OpRecord:
    return OpRecord(
        op_id=f"{root}/{name}",
        root_id=root,
        kind=kind,
        deps=tuple(Dep(op_id=f"{root}/{d}", kind=EdgeKind.DATA) for d in deps),
    )


def _four_call(root: str) -> list[OpRecord]:
    return [
        _op(root, "a"),
        _op(root, "b"),
        _op(root, "s", "a", "b"),
        _op(root, "v", "s"),
    ]


def _three_branches(root: str) -> list[OpRecord]:
    """plan -> three branches (research -> a transform -> review) -> write."""
    ops = [_op(root, "plan")]
    for x in "abc":
        ops += [
            _op(root, f"research_{x}", "plan"),
            _op(root, f"join_{x}", f"research_{x}", kind=OpKind.TRANSFORM),
            _op(root, f"review_{x}", f"join_{x}"),
        ]
    ops.append(_op(root, "write", "review_a", "review_b", "review_c"))
    return ops


def _trace(ops: list[OpRecord]) -> Trace:
    return Trace(manifest=Manifest(trace_id="t"), ops=ops)


def test_scheduled_width_of_twelve_four_call_roots_is_24_then_12_with_the_analyst_edge() -> None:
    roots = [f"r{i}" for i in range(12)]
    tr = _trace([op for r in roots for op in _four_call(r)])
    assert scheduled_width(tr.ops, honour_barrier=False) == 24
    ordered = apply_barrier(tr, [BarrierEdge(f"{r}/a", f"{r}/b") for r in roots])
    assert scheduled_width(ordered.ops, honour_barrier=True) == 12
    # DAG ignores barrier edges: the same ordered trace has DAG width 24
    assert scheduled_width(ordered.ops, honour_barrier=False) == 24


def test_scheduled_width_collapses_non_model_ops_and_orders_whole_branches() -> None:
    roots = ["x", "y", "z"]
    tr = _trace([op for r in roots for op in _three_branches(r)])
    assert scheduled_width(tr.ops, honour_barrier=False) == 9
    # branch a before branch b before branch c: every op of one before the next's first op
    edges = [
        BarrierEdge(f"{r}/{src}", f"{r}/research_{dst}")
        for r in roots
        for a, dst in (("a", "b"), ("b", "c"))
        for src in (f"research_{a}", f"join_{a}", f"review_{a}")
    ]
    assert scheduled_width(apply_barrier(tr, edges).ops, honour_barrier=True) == 3
    # ordering only a -> b leaves two concurrent branches per root
    half = [e for e in edges if e.dst_op.endswith("research_b")]
    assert scheduled_width(apply_barrier(tr, half).ops, honour_barrier=True) == 6


def test_peak_in_flight_counts_overlapping_model_calls_only() -> None:
    def timed(name: str, s: float, e: float | None, kind: OpKind = OpKind.MODEL) -> OpRecord:
        return OpRecord(
            op_id=name, root_id="r", kind=kind, times=OpTimes(submitted_s=s, completed_s=e)
        )

    ops = [
        timed("a", 0.0, 4.0),
        timed("b", 1.0, 2.0),
        timed("c", 2.0, 3.0),  # submitted as b completes: not concurrent with b
        timed("t", 1.5, 2.5, OpKind.TOOL),  # not a model call
        timed("d", 3.5, None),  # never completed: in flight to the end
    ]
    assert peak_in_flight(ops) == 2
    assert peak_in_flight([]) == 0


def test_mean_latency_change_is_paired_and_refuses_gaps() -> None:
    assert mean_latency_change_pct({"a": 2.0, "b": 4.0}, {"a": 3.0, "b": 6.0}) == pytest.approx(
        50.0
    )
    assert mean_latency_change_pct({"a": 2.0}, {"a": 2.0, "b": 1.0}) is None
    assert mean_latency_change_pct({"a": 2.0, "b": None}, {"a": 3.0, "b": 1.0}) is None
    assert mean_latency_change_pct({}, {}) is None


# -- the demo suite ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo(prefect_api: None) -> ReplaySuiteResult:
    res = run_suite(SUITE, scale="demo", prefect=False)
    assert isinstance(res.detail, ReplaySuiteResult)
    assert res.tables().get("findings", []) == res.detail.findings
    return res.detail


def _rows(demo: ReplaySuiteResult, prefix: str) -> dict[str, dict[str, object]]:
    return {
        str(r["figure"]).split(": ", 1)[1]: r
        for r in demo.findings
        if str(r["figure"]).startswith(prefix)
    }


def test_demo_rows_have_the_paper_columns_and_barrier_only_adds_latency(
    demo: ReplaySuiteResult,
) -> None:
    assert all(tuple(r) == PAPER_COLUMNS for r in demo.findings)
    for prefix in ("four-call Full", "four-call Selected", "GPT Researcher Full"):
        rows = _rows(demo, prefix)
        (change,) = [v for k, v in rows.items() if k.startswith("mean root latency change")]
        assert isinstance(change["measured"], float) and change["measured"] > 0
        dag_s = rows["mean root latency, DAG (s)"]["measured"]
        bar_s = rows["mean root latency, Barrier (s)"]["measured"]
        assert isinstance(dag_s, float) and isinstance(bar_s, float)
        assert change["measured"] == pytest.approx((bar_s / dag_s - 1) * 100)


def test_demo_widths_are_the_branches_then_the_roots(demo: ReplaySuiteResult) -> None:
    four = _rows(demo, "four-call Full")
    assert four["scheduled width, DAG (calls)"]["measured"] == 8.0  # 4 roots x 2 analysts
    assert four["scheduled width, Barrier (calls)"]["measured"] == 4.0
    gptr = _rows(demo, "GPT Researcher Full")
    assert gptr["scheduled width, DAG (calls)"]["measured"] == 9.0  # 3 roots x 3 branches
    assert gptr["scheduled width, Barrier (calls)"]["measured"] == 3.0
    for rows in (four, gptr):
        for arm in ("DAG", "Barrier"):
            peak = rows[f"peak in flight, {arm} (calls)"]["measured"]
            width = rows[f"scheduled width, {arm} (calls)"]["measured"]
            assert isinstance(peak, float) and isinstance(width, float) and 0 < peak <= width
    # the call count is recomputed from the frozen trace set
    research = demo.results["f1-barrier-research"]
    calls = sum(op.kind is OpKind.MODEL for op in research.trace_set.trace.ops)
    assert gptr["model calls in the frozen captures"]["measured"] == float(calls)


def test_demo_gpt_researcher_barrier_orders_whole_branches_in_every_root(
    demo: ReplaySuiteResult,
) -> None:
    research = demo.results["f1-barrier-research"]
    (barrier,) = [r for r in research.results if r.summary.arm == "barrier"]
    ops = barrier.run.trace.op_index()
    for root in research.trace_set.trace.roots:
        mine = [o for o in ops.values() if o.root_id == root.root_id and o.kind is OpKind.MODEL]

        def span(branch: str, ops_of_root: list[OpRecord] = mine) -> tuple[float, float]:
            times = [
                (o.times.submitted_s, o.times.completed_s)
                for o in ops_of_root
                if o.stage_id.rsplit("/", 1)[-1].endswith(f"_{branch}")
            ]
            assert times and all(s is not None and e is not None for s, e in times)
            return min(s for s, _ in times if s is not None), max(
                e for _, e in times if e is not None
            )

        a, b, c = span("a"), span("b"), span("c")
        assert a[1] <= b[0] and b[1] <= c[0]


def test_a_barrier_between_dependent_gpt_researcher_ops_is_refused(
    demo: ReplaySuiteResult,
) -> None:
    research = demo.results["f1-barrier-research"]
    sc = research.scenario
    bad = sc.model_copy(
        update={
            "arms": (
                sc.arms[1].model_copy(
                    update={
                        "barrier": (
                            sc.arms[1]
                            .barrier[0]
                            .model_copy(update={"before": "query_a", "after": "report_a"}),
                        )
                    }
                ),
            )
        }
    )
    with pytest.raises(
        IllegalReleaseError, match=r"f1_barrier_research\.yaml: arm 'barrier'.*not independent"
    ):
        arm_barrier(bad, research.trace_set, bad.arms[0])


def test_doctests() -> None:
    result = doctest.testmod(finding_f1, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
