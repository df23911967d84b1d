"""Root latency ends at the root's final op: k-of-n stragglers no longer extend it.

The hand-built root is a 2-of-3 fork-join: workers w0 (done at 2 s), w1 (3 s) and the straggler w2
(9 s); the judge j consumes w0 and w1, is ready at 3 s and produces the answer at 5 s.
"""

from __future__ import annotations

import pytest

from maserve_prefect.errors import TraceValidationError
from maserve_prefect.metrics.path import path_ledger
from maserve_prefect.metrics.task import (
    RootStatus,
    answer_ops,
    attempts,
    final_attempts,
    root_latencies,
    terminal_op,
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
    Trace,
)


def _op(
    op_id: str,
    ready: float,
    done: float | None,
    deps: tuple[str, ...] = (),
    status: OpStatus = OpStatus.COMPLETED,
) -> OpRecord:
    return OpRecord(
        op_id=f"r/{op_id}",
        root_id="r",
        kind=OpKind.MODEL,
        deps=tuple(Dep(op_id=f"r/{d}", kind=EdgeKind.DATA) for d in deps),
        num_input_tokens=100,
        num_output_tokens=10,
        times=OpTimes(ready_s=ready, submitted_s=ready, first_scheduled_s=ready, completed_s=done),
        status=status,
    )


def make_k_of_n_trace(
    final: str | None = "j",
    straggler: OpStatus = OpStatus.COMPLETED,
    judge: OpStatus = OpStatus.COMPLETED,
    worker1: OpStatus = OpStatus.COMPLETED,
) -> Trace:
    """The 2-of-3 fork-join root of the module docstring (arrival 0 s)."""
    ops = [
        _op("w0", 0.0, 2.0),
        _op("w1", 0.0, 3.0, status=worker1),
        _op("w2", 0.0, 9.0 if straggler is OpStatus.COMPLETED else None, status=straggler),
        _op("j", 3.0, 5.0 if judge is OpStatus.COMPLETED else None, ("w0", "w1"), judge),
    ]
    root = RootRecord(root_id="r", arrival_s=0.0, final_op_id=f"r/{final}" if final else None)
    return Trace(manifest=Manifest(trace_id="kofn"), roots=[root], ops=ops)


def test_root_latency_ends_at_the_final_op_not_the_straggler() -> None:
    (lat,) = root_latencies(make_k_of_n_trace())
    assert lat.status is RootStatus.COMPLETED
    assert lat.terminal_op_id == "r/j"
    assert lat.completed_s == 5.0 and lat.latency_s == 5.0


def test_without_a_final_op_the_last_completion_still_ends_the_root() -> None:
    (lat,) = root_latencies(make_k_of_n_trace(final=None))
    assert lat.terminal_op_id == "r/w2" and lat.latency_s == 9.0


def test_path_ledger_stops_at_the_final_op_and_reconciles() -> None:
    (path,) = path_ledger(make_k_of_n_trace())
    assert [s.op_id for s in path.segments] == ["r/w1", "r/j"]
    assert path.latency_s == 5.0
    assert abs(path.total_s - path.latency_s) < 1e-9
    assert "r/w2" not in {s.op_id for s in path.segments}


def test_a_straggler_that_fails_or_is_cut_off_leaves_the_root_completed() -> None:
    for status in (OpStatus.FAILED, OpStatus.INCOMPLETE):
        (lat,) = root_latencies(make_k_of_n_trace(straggler=status))
        assert lat.status is RootStatus.COMPLETED and lat.latency_s == 5.0
    # Without a final op the same straggler decides the root's status, as before.
    (lat,) = root_latencies(make_k_of_n_trace(final=None, straggler=OpStatus.FAILED))
    assert lat.status is RootStatus.FAILED and lat.latency_s is None


def test_the_answer_ops_decide_the_status() -> None:
    (lat,) = root_latencies(make_k_of_n_trace(judge=OpStatus.INCOMPLETE))
    assert lat.status is RootStatus.INCOMPLETE and lat.terminal_op_id is None
    (lat,) = root_latencies(make_k_of_n_trace(worker1=OpStatus.FAILED))
    assert lat.status is RootStatus.FAILED and lat.latency_s is None


def test_answer_ops_are_the_final_op_and_its_ancestors() -> None:
    trace = make_k_of_n_trace()
    finals = final_attempts(trace.ops)
    assert sorted(answer_ops(trace.roots[0], finals)) == ["r/j", "r/w0", "r/w1"]
    assert answer_ops(make_k_of_n_trace(final=None).roots[0], finals) == finals


def test_straggler_work_still_counts_as_consumed() -> None:
    summary = attempts(make_k_of_n_trace())[RootStatus.COMPLETED]
    assert summary.num_roots == 1 and summary.num_op_attempts == 4
    assert summary.num_output_tokens == 40


def test_terminal_op_falls_back_when_the_final_op_did_not_complete() -> None:
    ops = make_k_of_n_trace(judge=OpStatus.INCOMPLETE).ops
    assert terminal_op(ops, "r/j") is not None
    assert terminal_op(ops, "r/j").op_id == "r/w2"  # type: ignore[union-attr]
    assert terminal_op(make_k_of_n_trace().ops, "r/j").op_id == "r/j"  # type: ignore[union-attr]


def test_a_final_op_outside_the_root_is_refused() -> None:
    trace = make_k_of_n_trace(final="nope")
    with pytest.raises(TraceValidationError, match="final op 'r/nope'"):
        root_latencies(trace)
