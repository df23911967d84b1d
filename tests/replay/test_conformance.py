"""The conformance audit: work kept, early releases, wall-clock release lateness, native ratio."""

from __future__ import annotations

import dataclasses

import pytest
from replay_factories import make_trace
from rich.console import Console

from maserve_prefect.replay.conformance import ConformanceReport, audit, render
from maserve_prefect.replay.driver import ReplayRun, replay_trace
from maserve_prefect.trace.model import Trace
from maserve_prefect.trace.release import ReleaseRule


def _run(rule: str = "dag", num_roots: int = 2) -> ReplayRun:
    return replay_trace(make_trace(num_roots, model_tokens=(64, 8)), None, rule=rule, lock="length")


def _text(reports: list[ConformanceReport]) -> str:
    console = Console(width=200, record=True)
    console.print(render(reports))
    return console.export_text()


def test_dag_replay_passes_and_measures_every_release() -> None:
    run = _run("dag", 3)
    rep = audit(run)
    assert rep.token_mismatches == [] and rep.num_ops_checked == 9
    assert rep.num_early_releases == 0 and rep.early_releases_ok and not rep.non_causal
    assert rep.num_released == len(run.trace.ops) == len(run.release_wall_ns)
    assert all(sub >= trig for trig, sub in run.release_wall_ns.values())
    assert rep.lateness_p50_ms is not None and rep.lateness_p99_ms is not None
    assert 0.0 <= rep.lateness_p50_ms <= rep.lateness_p99_ms <= (rep.lateness_max_ms or 0.0)
    assert rep.root_ratio == {} and rep.root_ratio_median is None
    assert rep.row()["arm"] == "replay" and rep.row()["rule"] == "dag"


def test_flat_arm_is_flagged_non_causal_and_not_failed_for_early_releases() -> None:
    rep = audit(_run("flat"))
    assert rep.non_causal and rep.rule == "flat"
    assert rep.num_early_releases > 0  # a chain released all at once starts before its preds
    assert rep.early_releases_ok
    assert "flat (non-causal reference)" in _text([rep])


def test_early_release_on_a_causal_arm_fails() -> None:
    # The Flat run's realized times, judged as if it were a DAG arm.
    run = dataclasses.replace(_run("flat"), rule=ReleaseRule.DAG, non_causal=False)
    rep = audit(run)
    assert not rep.early_releases_ok and not rep.passed
    assert "FAIL: early releases" in _text([rep])


def test_changed_token_counts_are_listed_by_op() -> None:
    run = _run()
    ops = [
        op.model_copy(update={"num_output_tokens": 9}) if op.op_id == "r1/m" else op
        for op in run.trace.ops
    ]
    rep = audit(dataclasses.replace(run, trace=run.trace.model_copy(update={"ops": ops})))
    assert [(m.op_id, m.field, m.expected, m.realized) for m in rep.token_mismatches] == [
        ("r1/m", "num_output_tokens", 8, 9)
    ]
    assert not rep.passed
    assert "work changed (r1/m num_output_tokens)" in _text([rep])


def test_lateness_over_the_goal_fails() -> None:
    run = _run()
    slow = {op: (0, 2_000_000) for op in run.release_wall_ns}  # 2 ms each
    rep = audit(dataclasses.replace(run, release_wall_ns=slow))
    assert rep.lateness_p99_ms == pytest.approx(2.0) and rep.lateness_max_ms == pytest.approx(2.0)
    assert not rep.lateness_ok and not rep.passed
    assert "late releases" in _text([rep])


def _with_times_scaled(trace: Trace, factor: float) -> Trace:
    ops = []
    for op in trace.ops:
        t = op.times
        times = t.model_copy(
            update={k: None if v is None else v * factor for k, v in t.model_dump().items()}
        )
        ops.append(op.model_copy(update={"times": times}))
    roots = [r.model_copy(update={"arrival_s": r.arrival_s * factor}) for r in trace.roots]
    return trace.model_copy(update={"ops": ops, "roots": roots})


def test_replay_native_ratio_per_root_and_median() -> None:
    run = _run("dag", 2)
    same = audit(run, native_trace=run.trace)
    assert same.root_ratio == pytest.approx({"r0": 1.0, "r1": 1.0})
    slower = audit(run, native_trace=_with_times_scaled(run.trace, 2.0))
    assert slower.root_ratio_median == pytest.approx(0.5)


def test_ratio_matches_roots_across_the_cohort_prefix() -> None:
    run = _run("dag", 2)
    native = run.trace
    prefixed_roots = [r.model_copy(update={"root_id": f"c/{r.root_id}"}) for r in run.trace.roots]
    prefixed_ops = [o.model_copy(update={"root_id": f"c/{o.root_id}"}) for o in run.trace.ops]
    replay = run.trace.model_copy(update={"roots": prefixed_roots, "ops": prefixed_ops})
    rep = audit(dataclasses.replace(run, trace=replay, source=replay), native_trace=native)
    assert set(rep.root_ratio) == {"c/r0", "c/r1"}


def test_a_recorded_failure_the_replay_reproduces_is_not_a_replay_failure() -> None:
    from maserve_prefect.trace.model import OpStatus

    run = _run()
    failed = {"r0/a", "r1/a"}

    def mark(trace: Trace, ids: set[str]) -> Trace:
        ops = [o.model_copy(update={"status": OpStatus.FAILED}) if o.op_id in ids else o
               for o in trace.ops]  # fmt: skip
        return trace.model_copy(update={"ops": ops})

    # r0/a failed in the recorded run too; r1/a failed only in the replay
    rep = audit(dataclasses.replace(run, trace=mark(run.trace, failed),
                                    source=mark(run.source, {"r0/a"})))  # fmt: skip
    assert rep.failed_ops == ["r1/a"] and rep.incomplete_ops == [] and not rep.passed
    assert audit(run).completed_ok
