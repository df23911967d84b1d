"""A DAG replay honours composition decisions: CONTROL edges are release predecessors.

In code_repair, `validate` reads only the latest code (a data edge to the last repair), but it
runs only because a `run_tests` said "accept" and ended the repair loop. The recorded CONTROL
edge makes that run a release predecessor, so a DAG replay never releases `validate` before the
accepting verdict exists — although its data (the repair, which the test run checks) is ready
earlier.
"""

from __future__ import annotations

from maserve_prefect.replay.driver import replay_trace
from maserve_prefect.trace.cas import BlobStore
from maserve_prefect.trace.model import EdgeKind, OpRecord, Trace
from maserve_prefect.trace.release import ReleaseRule, release_predecessors

Loaded = tuple[Trace, BlobStore]


def _of(trace: Trace, root_id: str, stage: str) -> list[OpRecord]:
    """The root's ops of `stage` (every iteration), in iteration order."""
    ops = [
        op
        for op in trace.ops
        if op.root_id == root_id and op.stage_id.split("/", 1)[1].partition("#")[0] == stage
    ]
    return sorted(ops, key=lambda op: op.iteration)


def _accepted_roots(trace: Trace) -> dict[str, tuple[OpRecord, OpRecord, OpRecord]]:
    """Roots whose loop ended on "accept" (every earlier test run was repaired): root → (the
    accepting run_tests, the last repair, validate)."""
    out = {}
    for root in trace.roots:
        tests = _of(trace, root.root_id, "run_tests")
        repairs = _of(trace, root.root_id, "repair")
        if repairs and len(repairs) == len(tests) - 1:
            (validate,) = _of(trace, root.root_id, "validate")
            out[root.root_id] = (tests[-1], repairs[-1], validate)
    return out


def test_the_accepting_test_run_is_a_dag_release_predecessor_of_validate(
    code_repair: Loaded,
) -> None:
    trace, _ = code_repair
    accepted = _accepted_roots(trace)
    assert accepted, "the fixture's seed should end some repair loop on accept"
    preds = release_predecessors(trace, ReleaseRule.DAG)
    for accepting, repair, validate in accepted.values():
        assert (accepting.op_id, EdgeKind.CONTROL) in {(d.op_id, d.kind) for d in validate.deps}
        assert set(preds[validate.op_id]) == {accepting.op_id, repair.op_id}


def test_dag_replay_never_releases_validate_before_the_accepting_verdict(
    code_repair: Loaded,
) -> None:
    trace, store = code_repair
    run = replay_trace(trace, store, rule="dag")
    assert run.num_early_releases == 0
    replayed = _accepted_roots(run.trace)
    assert replayed.keys() == _accepted_roots(trace).keys()
    for accepting, repair, validate in replayed.values():
        assert validate.times.ready_s is not None and accepting.times.completed_s is not None
        assert repair.times.completed_s is not None
        # its data was ready before the verdict: only the control edge holds it back
        assert repair.times.completed_s < accepting.times.completed_s
        assert validate.times.ready_s >= accepting.times.completed_s
