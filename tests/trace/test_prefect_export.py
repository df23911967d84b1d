"""Prefect's run history vs the ledger: comparison rules, then a real native run on the test API."""

from __future__ import annotations

import pytest

from maserve_prefect.errors import ConfigError, TraceNotFoundError, TraceValidationError
from maserve_prefect.trace.bundle import canonical_trace
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import Dep, EdgeKind, OpKind, OpRecord, OpStatus
from maserve_prefect.trace.prefect_export import (
    PrefectTaskRun,
    compare,
    export_from_prefect,
    ledger_edges,
    read_task_runs,
    wait_for_prefect,
)
from maserve_prefect.trace.runs import PrefectLink


def make_ops() -> list[OpRecord]:
    a = OpRecord(op_id="r/a", root_id="r", kind=OpKind.MODEL)
    b = OpRecord(op_id="r/b", root_id="r", kind=OpKind.MODEL)
    c = OpRecord(
        op_id="r/c",
        root_id="r",
        kind=OpKind.MODEL,
        deps=(
            Dep(op_id="r/a", kind=EdgeKind.DATA),
            Dep(op_id="r/b", kind=EdgeKind.CONTROL),
            Dep(op_id="r/b", kind=EdgeKind.STATE),
        ),
    )
    return [a, b, c]


def make_links() -> list[PrefectLink]:
    return [PrefectLink(f"r/{x}", 1, "fr", f"t{x}") for x in "abc"]


def make_task_runs(**override: PrefectTaskRun) -> dict[str, PrefectTaskRun]:
    runs = {
        "ta": PrefectTaskRun("ta", "fr", "r/a", "COMPLETED"),
        "tb": PrefectTaskRun("tb", "fr", "r/b", "COMPLETED"),
        "tc": PrefectTaskRun(
            "tc", "fr", "r/c", "COMPLETED", data_inputs=(("x", "ta"),), control_inputs=("tb",)
        ),
    }
    runs.update(override)
    return runs


def test_ledger_edges_leave_out_state_edges() -> None:
    assert ledger_edges(make_ops()) == {
        ("r/a", "r/c", EdgeKind.DATA),
        ("r/b", "r/c", EdgeKind.CONTROL),
    }


def test_matching_views_agree() -> None:
    agreement = compare(make_ops(), make_links(), make_task_runs())
    assert agreement.ok, agreement.describe()
    assert (agreement.num_ops, agreement.num_task_runs, agreement.num_edges) == (3, 3, 2)
    assert agreement.describe() == ""


def test_missing_unlinked_and_unfinished_task_runs_are_reported() -> None:
    runs = make_task_runs(tz=PrefectTaskRun("tz", "fr", "stray", "COMPLETED"))
    del runs["tb"]
    runs["ta"] = PrefectTaskRun("ta", "fr", "r/a", "RUNNING")
    agreement = compare(make_ops(), make_links(), runs)
    assert agreement.missing == ("r/b",)
    assert agreement.unlinked == ("tz",)
    assert agreement.unfinished == ("r/a",)
    assert not agreement.ok


def test_edge_and_state_differences_name_ops_and_parameter() -> None:
    runs = make_task_runs(
        tc=PrefectTaskRun("tc", "fr", "r/c", "FAILED", data_inputs=(("x", "ta"), ("name", "tb")))
    )
    agreement = compare(make_ops(), make_links(), runs)
    assert agreement.only_prefect == {("r/b", "r/c", EdgeKind.DATA)}
    assert agreement.only_ledger == {("r/b", "r/c", EdgeKind.CONTROL)}
    assert agreement.state_mismatch == (("r/c", OpStatus.COMPLETED.value, "FAILED"),)
    text = agreement.describe()
    assert "r/b -data-> r/c (name)" in text
    assert "r/b -control-> r/c" in text


def test_export_needs_exactly_one_scope() -> None:
    ledger = Ledger("sqlite://", MemoryStore())
    with pytest.raises(ConfigError):
        export_from_prefect(ledger)
    with pytest.raises(TraceNotFoundError, match="no ledger run links"):
        export_from_prefect(ledger, flow_run_id="00000000-0000-0000-0000-000000000000")


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
@pytest.mark.parametrize(
    ("workflow", "users"),
    [
        ("fork_join", 2),
        ("spawn", 2),
        ("refinement_loop", 2),
        ("debate", 2),
        # a composition decision: validate waits for the accepting run_tests (a CONTROL edge)
        ("code_repair", 1),
    ],
)
def test_prefect_history_agrees_with_the_ledger(workflow: str, users: int) -> None:
    from maserve_prefect.flows.native import run_native

    ledger = Ledger("sqlite://", MemoryStore())
    run = run_native(workflow, users=users, seed=0, ledger=ledger)
    tid = run.trace.manifest.trace_id
    progress = wait_for_prefect(ledger, tid, timeout_s=90, poll_s=0.5)
    assert progress.complete, progress

    links = ledger.prefect_links(tid)
    ledger_trace = ledger.load_trace(tid)
    task_runs = read_task_runs({lk.flow_run_id for lk in links if lk.flow_run_id})
    # (a) task runs <-> ledger ops one to one, by id and count (task runs are named by op id)
    assert len(task_runs) == len(ledger_trace.ops) == len(links)
    assert {str(lk.task_run_id) for lk in links} == set(task_runs)
    assert sorted(tr.name for tr in task_runs.values()) == sorted(
        op.op_id for op in ledger_trace.ops
    )

    export = export_from_prefect(ledger, trace_id=tid)
    # (b) the data / control edges Prefect recorded equal the ledger's
    assert export.agreement.ok, export.agreement.describe()
    assert export.agreement.num_edges == len(ledger_edges(ledger_trace.ops)) > 0
    if workflow == "code_repair":  # the comparison saw control edges (Prefect's wait_for)
        assert EdgeKind.CONTROL in {kind for _, _, kind in ledger_edges(ledger_trace.ops)}
    export.check()
    # (c) the trace assembled from Prefect equals the ledger's
    assert canonical_trace(export.trace) == canonical_trace(ledger_trace)

    # one flow run = one root
    first = export.flow_run_ids[0]
    one = export_from_prefect(ledger, flow_run_id=first)
    assert one.agreement.ok, one.agreement.describe()
    assert len({op.root_id for op in one.trace.ops}) == 1
    assert {op.op_id for op in one.trace.ops} == {
        lk.op_id for lk in links if lk.flow_run_id == first
    }


@pytest.mark.usefixtures("prefect_api")
def test_disagreement_raises_with_the_diff() -> None:
    from maserve_prefect.flows.native import run_native

    ledger = Ledger("sqlite://", MemoryStore())
    run = run_native("fork_join", users=1, seed=2, ledger=ledger)
    tid = run.trace.manifest.trace_id
    assert wait_for_prefect(ledger, tid, timeout_s=90, poll_s=0.5).complete
    victim = ledger.prefect_links(tid)[0]
    # re-link one op to a task run Prefect never saw: its real task run becomes unlinked
    ledger.link_prefect(
        tid, victim.op_id, flow_run_id=victim.flow_run_id, task_run_id="not-a-task-run"
    )
    export = export_from_prefect(ledger, trace_id=tid)
    assert export.agreement.missing == (victim.op_id,)
    assert export.agreement.unlinked == (victim.task_run_id,)
    with pytest.raises(TraceValidationError, match="disagree"):
        export.check()


@pytest.mark.usefixtures("prefect_api")
def test_roots_are_named_tagged_subflows_of_one_parent_flow_run() -> None:
    """What the Prefect UI shows of a native run: one parent flow run (named by the trace id)
    whose subflows are the roots, each named `workflow/root · instance` and tagged; the parent's
    tracking task runs are not ops (the ledger still agrees with Prefect one to one)."""
    from maserve_prefect.flows.native import run_native
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentTaskRunId

    ledger = Ledger("sqlite://", MemoryStore())
    run = run_native("fork_join", users=2, seed=4, ledger=ledger, trace_id="ui-names-t1")
    tid = run.trace.manifest.trace_id
    assert wait_for_prefect(ledger, tid, timeout_s=90, poll_s=0.5).complete
    assert export_from_prefect(ledger, trace_id=tid).agreement.ok
    instances = {r.root_id: r.instance_id for r in run.roots}
    with get_client(sync_client=True) as client:
        roots = [client.read_flow_run(fid) for fid in run.flow_run_ids]
        assert sorted(r.name for r in roots) == sorted(
            f"fork_join/{rid} · {inst}" for rid, inst in instances.items()
        )
        tags = {"workflow:fork_join", "binding:math", "engine:sim", f"trace:{tid}"}
        for r in roots:
            assert tags <= set(r.tags), r.tags
            assert r.parent_task_run_id is not None
        trackers = [client.read_task_run(r.parent_task_run_id) for r in roots]  # type: ignore[arg-type]
        parents = {t.flow_run_id for t in trackers}
        assert len(parents) == 1 and None not in parents
        (parent_id,) = parents
        parent = client.read_flow_run(parent_id)  # type: ignore[arg-type]
        assert parent.name == tid and parent.parent_task_run_id is None
        assert run.parent_flow_run_id == str(parent_id)
        assert tags <= set(parent.tags)
        assert sorted(t.name for t in trackers) == sorted(r.name for r in roots)
        children = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_task_run_id=FlowRunFilterParentTaskRunId(any_=[t.id for t in trackers])
            )
        )
        assert {str(c.id) for c in children} == set(run.flow_run_ids)
