"""Target co-batching shares and the pure-decode batch on hand-made step records (paper Fig. 10a's
definitions: time-weighted, targets counted once per interval, clipped to a window)."""

from __future__ import annotations

import pytest

from maserve_prefect.engines.sim.step.records import ScheduledTokens, StepKind, StepRecord
from maserve_prefect.metrics.cobatch import pure_decode_batch, request_groups, target_cobatching
from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, RootRecord, Trace

GROUPS = {"t1": "target", "t2": "target", "l": "refinement_loop", "s": "spawn", "f": "fork_join"}


def rec(t0: float, t1: float, *rids: str, kind: StepKind = StepKind.DECODE) -> StepRecord:
    sched = tuple(ScheduledTokens(r, 10, 1) for r in rids)
    return StepRecord("r", 0, t0, t1, 1, kind, sched, len(rids), 0.0, 0.0, 0.0, 0.0, ())


def test_cobatching_counts_target_intervals_once_and_all_needs_every_class() -> None:
    recs = [
        rec(0.0, 1.0, "t1", "t2", "l", "s", "f"),  # two targets, all three classes: 1 s
        rec(1.0, 3.0, "t1", "l", "s"),  # no Fork-Join: 2 s
        rec(3.0, 4.0, "l", "s", "f"),  # no target: not in the denominator
        rec(4.0, 5.0, "t2"),  # a target alone: 1 s
    ]
    shares = target_cobatching(recs, GROUPS)
    assert shares == pytest.approx(
        {"fork_join": 1 / 4, "refinement_loop": 3 / 4, "spawn": 3 / 4, "all": 1 / 4}
    )
    # clipped to [0.5, 2.0): 0.5 s with all three, 1 s without Fork-Join
    clipped = target_cobatching(recs, GROUPS, window=(0.5, 2.0))
    assert clipped["all"] == pytest.approx(0.5 / 1.5)
    assert target_cobatching(recs[2:3], GROUPS) == {}  # no target scheduled: no share


def test_pure_decode_batch_weights_pure_decode_intervals_in_the_window() -> None:
    recs = [
        rec(0.0, 1.0, "a", "b", "c", "d"),
        rec(1.0, 2.0, "a", "b", kind=StepKind.MIXED),  # not pure decode
        rec(2.0, 5.0, "a", "b"),
    ]
    assert pure_decode_batch(recs) == pytest.approx((4 * 1 + 2 * 3) / 4)
    assert pure_decode_batch(recs, window=(0.5, 3.0)) == pytest.approx((4 * 0.5 + 2) / 1.5)
    assert pure_decode_batch(recs[1:2]) is None


def test_request_groups_tag_target_ops_and_class_the_rest() -> None:
    trace = Trace(
        manifest=Manifest(trace_id="x"),
        roots=[RootRecord(root_id="t/r0", workflow="refinement_loop"),
               RootRecord(root_id="b/r0", workflow="spawn")],
        ops=[OpRecord(op_id="t/r0/m", root_id="t/r0", kind=OpKind.MODEL),
             OpRecord(op_id="b/r0/m", root_id="b/r0", kind=OpKind.MODEL)],
    )  # fmt: skip
    groups = request_groups(trace, {"t/r0": "target", "b/r0": "background"})
    assert groups == {"t/r0/m": "target", "b/r0/m": "spawn"}
