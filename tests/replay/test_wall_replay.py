"""Wall-clock replay: the same driver on a WallClock, with replicas built on that clock.

Simulated replicas paced on the wall clock stand in for a server here (the real vLLM runs in the
integration tests): the work must stay fixed, no op may be released early, and every released op
must carry its release lag so the conformance audit can report lateness on the wall clock.
"""

from __future__ import annotations

import pytest
from replay_factories import make_trace, paced_sim, scaled, wrapped
from rich.console import Console

from maserve_prefect.errors import UnsupportedError
from maserve_prefect.metrics.task import RootStatus
from maserve_prefect.replay.conformance import audit, render, wall_lateness_ms
from maserve_prefect.replay.driver import replay_trace
from maserve_prefect.trace.model import OpKind, OpStatus


def test_wall_replay_keeps_the_work_and_never_releases_early() -> None:
    trace = make_trace(3, model_tokens=(64, 8))
    run = replay_trace(trace, None, rule="dag", lock="length", replicas_factory=paced_sim)
    assert run.pool is None and run.step_rows() == []
    assert run.num_early_releases == 0 and run.num_incomplete_ops == 0
    src = trace.op_index()
    for op in run.trace.ops:
        assert op.status is OpStatus.COMPLETED
        if op.kind is OpKind.MODEL:
            assert op.num_output_tokens == src[op.op_id].num_output_tokens
            assert op.num_input_tokens == src[op.op_id].num_input_tokens
    assert set(run.root_latency_s) == {r.root_id for r in trace.roots}
    # Every op has a release lag; a release never precedes its predecessor's completion.
    assert set(run.release_lag_s) == set(src)
    for done_s, released_s in run.release_lag_s.values():
        assert released_s >= done_s


def test_wall_replay_reports_incomplete_ops_at_the_timeout() -> None:
    trace = make_trace(2, model_tokens=(64, 8))
    # 1 simulated second takes 100 wall seconds: nothing can finish within the 0.2 s limit.
    run = replay_trace(
        trace, None, rule="dag", lock="length", replicas_factory=scaled(100.0), timeout_s=0.2
    )
    assert run.num_incomplete_ops > 0
    assert len(run.root_latency_s) < len(trace.roots)


def test_audit_of_a_wall_run_measures_from_engine_completion() -> None:
    trace = make_trace(2, model_tokens=(64, 8))
    run = replay_trace(trace, None, rule="dag", lock="length", replicas_factory=paced_sim)
    rep = audit(run)
    assert rep.basis == "engine completion -> release"
    assert rep.num_released == len(run.release_lag_s) == len(trace.ops)
    assert not rep.token_mismatches and rep.num_early_releases == 0
    late = wall_lateness_ms(run)
    assert all(v >= 0.0 for v in late) and rep.lateness_max_ms == max(late)


def test_audit_fails_a_replay_that_timed_out_naming_the_ops() -> None:
    trace = make_trace(2, model_tokens=(64, 8))
    run = replay_trace(
        trace, None, rule="dag", lock="length", replicas_factory=scaled(100.0), timeout_s=0.2
    )
    rep = audit(run)
    every = sorted(op.op_id for op in trace.ops)
    # nothing finished: every op is reported, none is "compared" and found equal
    assert rep.incomplete_ops == every and rep.failed_ops == []
    assert rep.num_ops_checked == 0 and not rep.token_mismatches
    assert not rep.completed_ok and not rep.passed
    row = rep.row()
    assert (row["incomplete_ops"], row["failed_ops"], row["passed"]) == (len(every), 0, False)
    assert row["incomplete_op_ids"] == ", ".join(every)
    assert all(run.trace.op_index()[o].status is OpStatus.INCOMPLETE for o in every)


def test_audit_fails_a_replay_with_a_failed_op() -> None:
    trace = make_trace(2, model_tokens=(64, 8))
    run = replay_trace(trace, None, rule="dag", lock="length", replicas_factory=wrapped(["r1/m"]))
    assert run.num_failed_ops == 1 and run.num_incomplete_ops == 0
    rep = audit(run)
    assert rep.failed_ops == ["r1/m"] and rep.incomplete_ops == []
    assert not rep.token_mismatches  # the failed op is reported as failed, not as a mismatch
    assert rep.num_ops_checked == len(trace.ops) - 1 and not rep.passed
    assert (rep.row()["failed_ops"], rep.row()["failed_op_ids"]) == (1, "r1/m")
    console = Console(width=250, record=True)
    console.print(render([rep]))
    assert "FAIL: 1 ops failed (r1/m)" in console.export_text()
    assert run.root_status() == {"r0": RootStatus.COMPLETED, "r1": RootStatus.FAILED}


def test_token_lock_on_a_replica_without_token_ids_is_unsupported() -> None:
    trace = make_trace(1, model_tokens=(64, 8))
    with pytest.raises(UnsupportedError, match=r"token-locked replay is unsupported.*lock: length"):
        replay_trace(
            trace, None, rule="dag", lock="token", replicas_factory=wrapped(token_ids=False)
        )
    run = replay_trace(
        trace, None, rule="dag", lock="length", replicas_factory=wrapped(token_ids=False)
    )
    assert run.num_incomplete_ops == 0 and run.num_failed_ops == 0
