"""Tests for metrics.task: root latency, stage time and attempts on hand-built traces."""

from __future__ import annotations

import pytest

from maserve_prefect.errors import TraceValidationError
from maserve_prefect.metrics.task import (
    RootStatus,
    attempts,
    final_attempts,
    root_class,
    root_latencies,
    stage_times,
)
from maserve_prefect.trace.model import (
    Dep,
    EdgeKind,
    Manifest,
    OpKind,
    OpRecord,
    OpStatus,
    OpTimes,
    RootRecord,
    StageRecord,
    Trace,
)


def make_op(
    op_id: str,
    root: str = "r",
    stage: str = "",
    ready: float | None = None,
    done: float | None = None,
    deps: tuple[str, ...] = (),
    status: OpStatus = OpStatus.COMPLETED,
    attempt: int = 1,
    n_in: int = 0,
    n_cached: int = 0,
    n_out: int = 0,
) -> OpRecord:
    return OpRecord(
        op_id=op_id,
        root_id=root,
        stage_id=stage,
        kind=OpKind.MODEL,
        deps=tuple(Dep(op_id=d, kind=EdgeKind.DATA) for d in deps),
        times=OpTimes(ready_s=ready, completed_s=done),
        status=status,
        attempt=attempt,
        num_input_tokens=n_in,
        num_cached_tokens=n_cached,
        num_output_tokens=n_out,
    )


def make_trace(roots: list[RootRecord], ops: list[OpRecord], stages=()) -> Trace:
    return Trace(manifest=Manifest(trace_id="t"), roots=roots, ops=ops, stages=list(stages))


def test_root_latency_is_arrival_to_last_completion() -> None:
    trace = make_trace(
        [RootRecord(root_id="r", arrival_s=2.0, workflow="fj")],
        [make_op("a", ready=2.5, done=7.0), make_op("b", ready=2.5, done=5.0)],
    )
    [lat] = root_latencies(trace)
    assert lat.status is RootStatus.COMPLETED
    assert lat.terminal_op_id == "a"
    assert lat.latency_s == pytest.approx(5.0)
    assert lat.workload_class == "fj"


def test_root_class_prefers_workload_class() -> None:
    assert root_class(RootRecord(root_id="r", workflow="w", workload_class="c")) == "c"
    assert root_class(RootRecord(root_id="r", workflow="w")) == "w"


def test_status_failed_incomplete_and_empty_roots() -> None:
    roots = [RootRecord(root_id=r) for r in ("ok", "bad", "cut", "empty")]
    ops = [
        make_op("ok/0", root="ok", ready=0.0, done=1.0),
        make_op("bad/0", root="bad", ready=0.0, done=1.0, status=OpStatus.FAILED),
        make_op("cut/0", root="cut", ready=0.0, done=1.0),
        make_op("cut/1", root="cut", ready=1.0, done=None, status=OpStatus.INCOMPLETE),
    ]
    lats = {x.root_id: x for x in root_latencies(make_trace(roots, ops))}
    assert [lats[r].status for r in ("ok", "bad", "cut", "empty")] == [
        RootStatus.COMPLETED,
        RootStatus.FAILED,
        RootStatus.INCOMPLETE,
        RootStatus.INCOMPLETE,
    ]
    assert lats["bad"].latency_s is None and lats["cut"].latency_s is None


def test_retry_final_attempt_decides_status_and_latency() -> None:
    ops = [
        make_op("a", ready=0.0, done=1.0, status=OpStatus.FAILED, attempt=1),
        make_op("a", ready=1.0, done=3.0, attempt=2),
    ]
    trace = make_trace([RootRecord(root_id="r")], ops)
    assert final_attempts(ops)["a"].attempt == 2
    [lat] = root_latencies(trace)
    assert lat.status is RootStatus.COMPLETED and lat.latency_s == 3.0


def test_unknown_root_and_completion_before_arrival_raise() -> None:
    with pytest.raises(TraceValidationError, match="no root record"):
        root_latencies(make_trace([], [make_op("a", root="zz", done=1.0)]))
    with pytest.raises(TraceValidationError, match="before the root's arrival"):
        root_latencies(
            make_trace([RootRecord(root_id="r", arrival_s=5.0)], [make_op("a", done=1.0)])
        )


def test_stage_time_includes_nested_stages_and_needs_all_done() -> None:
    stages = [
        StageRecord(stage_id="s", root_id="r", name="outer"),
        StageRecord(stage_id="s.c", root_id="r", name="inner", parent_stage_id="s"),
        StageRecord(stage_id="u", root_id="r", name="unfinished"),
    ]
    ops = [
        make_op("a", stage="s", ready=1.0, done=2.0),
        make_op("b", stage="s.c", ready=0.5, done=4.0),
        make_op("c", stage="u", ready=3.0, done=None, status=OpStatus.INCOMPLETE),
    ]
    st = {s.stage_id: s for s in stage_times(make_trace([RootRecord(root_id="r")], ops, stages))}
    assert (st["s"].start_s, st["s"].end_s, st["s"].duration_s) == (0.5, 4.0, 3.5)
    assert (st["s.c"].start_s, st["s.c"].end_s) == (0.5, 4.0)
    assert st["u"].start_s == 3.0 and st["u"].end_s is None and st["u"].duration_s is None


def test_attempts_count_work_of_every_attempt() -> None:
    roots = [RootRecord(root_id="ok"), RootRecord(root_id="bad")]
    ops = [
        make_op("ok/0", root="ok", done=1.0, n_in=100, n_cached=40, n_out=10),
        make_op("bad/0", root="bad", done=1.0, n_in=50, n_out=5, status=OpStatus.FAILED),
        make_op(
            "bad/0",
            root="bad",
            done=2.0,
            n_in=50,
            n_cached=50,
            n_out=3,
            status=OpStatus.FAILED,
            attempt=2,
        ),
    ]
    summ = attempts(make_trace(roots, ops))
    ok, bad = summ[RootStatus.COMPLETED], summ[RootStatus.FAILED]
    assert (ok.num_roots, ok.num_op_attempts, ok.num_prefill_tokens, ok.num_output_tokens) == (
        1, 1, 60, 10,
    )  # fmt: skip
    assert (bad.num_roots, bad.num_op_attempts, bad.num_prefill_tokens, bad.num_output_tokens) == (
        1, 2, 50, 8,
    )  # fmt: skip
    assert summ[RootStatus.INCOMPLETE].num_roots == 0
