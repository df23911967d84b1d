"""Tests for metrics.path: the completion-path ledger reconciles to root latency."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maserve_prefect.errors import TraceValidationError
from maserve_prefect.metrics.path import SEGMENTS, path_ledger, path_shares
from maserve_prefect.metrics.task import root_latencies
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
    times: tuple[float | None, float | None, float | None, float | None],
    deps: tuple[str, ...] = (),
    root: str = "r",
    kind: OpKind = OpKind.MODEL,
) -> OpRecord:
    ready, sub, sched, done = times
    return OpRecord(
        op_id=op_id,
        root_id=root,
        kind=kind,
        deps=tuple(Dep(op_id=d, kind=EdgeKind.DATA) for d in deps),
        times=OpTimes(ready_s=ready, submitted_s=sub, first_scheduled_s=sched, completed_s=done),
    )


def make_trace(ops: list[OpRecord], arrival_s: float = 0.0) -> Trace:
    roots = sorted({op.root_id for op in ops})
    return Trace(
        manifest=Manifest(trace_id="t"),
        roots=[RootRecord(root_id=r, arrival_s=arrival_s) for r in roots],
        ops=ops,
    )


def test_fork_join_path_follows_latest_dependency() -> None:
    # a and b run in parallel from arrival 1.0; j waits for both; b finishes last.
    ops = [
        make_op("a", (1.0, 1.5, 2.0, 4.0)),
        make_op("b", (1.0, 1.25, 3.0, 6.0)),
        make_op("j", (6.5, 7.0, 7.5, 9.0), deps=("a", "b")),
    ]
    [p] = path_ledger(make_trace(ops, arrival_s=1.0))
    assert [s.op_id for s in p.segments] == ["b", "j"]
    assert [s.binding_pred for s in p.segments] == [None, "b"]
    b, j = p.segments
    assert (b.boundary_gap_s, b.pre_submission_s, b.backend_wait_s, b.scheduled_residence_s) == (
        0.0, 0.25, 1.75, 3.0,
    )  # fmt: skip
    assert (j.boundary_gap_s, j.pre_submission_s, j.backend_wait_s, j.scheduled_residence_s) == (
        0.5, 0.5, 0.5, 1.5,
    )  # fmt: skip
    assert p.latency_s == 8.0
    assert p.total_s == pytest.approx(8.0, abs=1e-12)
    assert p.totals() == {
        "boundary_gap_s": 0.5,
        "pre_submission_s": 0.75,
        "backend_wait_s": 2.25,
        "scheduled_residence_s": 4.5,
    }


def test_ties_break_by_larger_op_id() -> None:
    ops = [
        make_op("a", (0.0, 0.0, 0.0, 2.0)),
        make_op("b", (0.0, 0.0, 0.0, 2.0)),
        make_op("j", (2.0, 2.0, 2.0, 3.0), deps=("a", "b")),
    ]
    [p] = path_ledger(make_trace(ops))
    assert [s.op_id for s in p.segments] == ["b", "j"]


def test_missing_timestamps_collapse_to_zero_segments() -> None:
    # a tool op: no first_scheduled → its run counts as residence; b: only ready and completed.
    ops = [
        make_op("t", (0.5, 1.0, None, 3.0), kind=OpKind.TOOL),
        make_op("b", (None, None, None, 5.0), deps=("t",)),
    ]
    [p] = path_ledger(make_trace(ops))
    t, b = p.segments
    assert (t.boundary_gap_s, t.pre_submission_s, t.backend_wait_s, t.scheduled_residence_s) == (
        0.5, 0.5, 0.0, 2.0,
    )  # fmt: skip
    assert (b.boundary_gap_s, b.pre_submission_s, b.backend_wait_s, b.scheduled_residence_s) == (
        0.0, 0.0, 0.0, 2.0,
    )  # fmt: skip
    assert p.total_s == p.latency_s == 5.0


def test_dependency_finishing_after_release_does_not_bind() -> None:
    # Flat arm: j released at 0 although a finishes at 4; the path is j alone.
    ops = [make_op("a", (0.0, 0.0, 0.0, 4.0)), make_op("j", (0.0, 0.0, 1.0, 5.0), deps=("a",))]
    [p] = path_ledger(make_trace(ops))
    assert [s.op_id for s in p.segments] == ["j"]
    assert p.total_s == 5.0


def test_out_of_order_times_are_clamped_and_still_reconcile() -> None:
    # ready before arrival, submitted before ready: clamped to zero-length segments.
    ops = [make_op("a", (0.0, -1.0, 2.0, 3.0))]
    [p] = path_ledger(make_trace(ops, arrival_s=1.0))
    s = p.segments[0]
    assert (s.boundary_gap_s, s.pre_submission_s, s.backend_wait_s, s.scheduled_residence_s) == (
        0.0, 0.0, 1.0, 1.0,
    )  # fmt: skip


def test_times_after_own_completion_raise() -> None:
    ops = [make_op("a", (0.0, 0.0, 5.0, 3.0))]
    with pytest.raises(TraceValidationError, match=r"\['a'\]"):
        path_ledger(make_trace(ops))


def test_missing_dependency_raises_naming_both_ops() -> None:
    ops = [make_op("j", (0.0, 0.0, 0.0, 1.0), deps=("ghost",))]
    with pytest.raises(TraceValidationError, match="'j' depends on 'ghost'"):
        path_ledger(make_trace(ops))


def test_path_shares_average_over_roots() -> None:
    ops = [
        make_op("x/0", (0.0, 0.0, 0.0, 2.0), root="x"),  # all residence
        make_op("y/0", (0.0, 0.0, 2.0, 4.0), root="y"),  # half wait, half residence
    ]
    shares = path_shares(path_ledger(make_trace(ops)))
    assert shares["backend_wait_s"] == pytest.approx(0.25)
    assert shares["scheduled_residence_s"] == pytest.approx(0.75)


@st.composite
def dag_traces(draw: st.DrawFn) -> Trace:
    """Random DAG roots with consistent times: an op is ready after its deps complete."""
    num_roots = draw(st.integers(1, 3))
    ops: list[OpRecord] = []
    roots = []
    durations = st.floats(0.0, 50.0, allow_nan=False, allow_infinity=False)
    for r in range(num_roots):
        arrival = draw(st.floats(0.0, 1e4, allow_nan=False))
        roots.append(RootRecord(root_id=f"r{r}", arrival_s=arrival))
        n = draw(st.integers(1, 8))
        done: list[float] = []
        for i in range(n):
            deps = sorted(draw(st.sets(st.integers(0, i - 1), max_size=3))) if i else []
            base = max((done[d] for d in deps), default=arrival)
            ready = base + draw(durations)
            sub = ready + draw(durations)
            sched = sub + draw(durations)
            end = sched + draw(durations)
            missing = draw(st.sets(st.sampled_from(["ready", "sub", "sched"]), max_size=2))
            times = (
                None if "ready" in missing else ready,
                None if "sub" in missing else sub,
                None if "sched" in missing else sched,
                end,
            )
            ops.append(
                make_op(f"r{r}/{i}", times, deps=tuple(f"r{r}/{d}" for d in deps), root=f"r{r}")
            )
            done.append(end)
    order = draw(st.permutations(ops))
    return Trace(manifest=Manifest(trace_id="t"), roots=roots, ops=list(order))


@settings(max_examples=150, deadline=None)
@given(dag_traces())
def test_ledger_reconciles_to_root_latency(trace: Trace) -> None:
    paths = {p.root_id: p for p in path_ledger(trace)}
    lats = root_latencies(trace)
    assert set(paths) == {x.root_id for x in lats}
    for lat in lats:
        p = paths[lat.root_id]
        assert lat.latency_s is not None
        assert abs(sum(p.totals().values()) - lat.latency_s) <= 1e-9
        assert p.segments[-1].op_id == lat.terminal_op_id
        for s in p.segments:
            assert all(getattr(s, name) >= 0.0 for name in SEGMENTS)
        # each op on the path (after the first) has its binding predecessor just before it
        ids = [s.op_id for s in p.segments]
        assert [s.binding_pred for s in p.segments] == [None, *ids[:-1]]


def test_native_run_ledger_reconciles(native_run) -> None:
    trace = native_run.trace
    paths = path_ledger(trace)
    lats = [x for x in root_latencies(trace) if x.latency_s is not None]
    assert len(paths) == len(lats) == len(trace.roots) > 0
    for p, lat in zip(paths, lats, strict=True):
        assert abs(p.total_s - (lat.latency_s or 0.0)) <= 1e-9
        assert p.segments[-1].op_id == lat.terminal_op_id
