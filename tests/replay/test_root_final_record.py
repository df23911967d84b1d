"""Recording a root's final op: `Harness.mark_final`, `Ledger.set_root_final`, bundle round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlmodel import Session, select

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.errors import TraceValidationError
from maserve_prefect.taskrunner.harness import Harness
from maserve_prefect.taskrunner.lockstep import VirtualGate
from maserve_prefect.taskrunner.oprun import OpRun, Scope
from maserve_prefect.trace.bundle import export_bundle, import_bundle
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, RootRecord
from maserve_prefect.trace.tables import RootRow


def _ledger() -> Ledger:
    lg = Ledger("sqlite://", MemoryStore())
    lg.begin_run(Manifest(trace_id="t"))
    for root in ("a", "b"):
        lg.add_root("t", RootRecord(root_id=root, workflow="wf", arrival_s=1.5))
        lg.append_op("t", OpRecord(op_id=f"{root}/0", root_id=root, kind=OpKind.MODEL))
    return lg


def _root_row(lg: Ledger, root_id: str) -> RootRow:
    with Session(lg.engine) as s:
        row = s.exec(select(RootRow).where(RootRow.root_id == root_id)).one()
        s.expunge(row)
        return row


def test_set_root_final_updates_only_the_record() -> None:
    lg = _ledger()
    before = _root_row(lg, "a")
    lg.set_root_final("t", "a", "a/0")
    after = _root_row(lg, "a")
    assert RootRecord.model_validate_json(after.record_json) == RootRecord.model_validate_json(
        before.record_json
    ).model_copy(update={"final_op_id": "a/0"})
    assert (after.id, after.trace_id, after.root_id, after.workflow, after.arrival_s) == (
        before.id, before.trace_id, before.root_id, before.workflow, before.arrival_s,
    )  # fmt: skip
    roots = {r.root_id: r for r in lg.load_trace("t").roots}
    assert roots["a"].final_op_id == "a/0" and roots["b"].final_op_id is None


@pytest.mark.parametrize(
    ("root", "op", "match"),
    [
        ("zz", "a/0", "root is not recorded"),
        ("a", "a/9", "op is not recorded"),
        ("a", "b/0", "belongs to root 'b'"),
    ],
)
def test_set_root_final_refuses_unknown_root_or_op(root: str, op: str, match: str) -> None:
    lg = _ledger()
    with pytest.raises(TraceValidationError, match=match):
        lg.set_root_final("t", root, op)
    assert all(r.final_op_id is None for r in lg.load_trace("t").roots)


def _finish(h: Harness, root: str, n: int) -> str:
    scope = Scope(root_id=root, stage_id="s", workflow="wf")
    h.see_scope(scope)
    op = OpRun(op_id=h.new_op_id(scope), scope=scope, kind=OpKind.TRANSFORM, task_name="x")
    return h.finish(op, flow_run_id=None, task_run_id=f"task-{root}-{n}").op_id


def test_harness_mark_final_updates_book_and_ledger() -> None:
    lg = Ledger("sqlite://", MemoryStore())
    h = Harness(VirtualGate(Kernel()), Manifest(trace_id="run"), ledger=lg)
    answer = _finish(h, "r0", 0)
    _finish(h, "r0", 1)  # a straggler of the same root
    other = _finish(h, "r1", 0)
    h.mark_final("r0", answer)
    assert h.book.roots["r0"].final_op_id == answer
    assert h.book.roots["r1"].final_op_id is None
    stored = {r.root_id: r.final_op_id for r in lg.load_trace("run").roots}
    assert stored == {"r0": answer, "r1": None}
    with pytest.raises(TraceValidationError, match="belongs to root 'r1'"):
        h.mark_final("r0", other)
    with pytest.raises(TraceValidationError, match="has no record"):
        h.mark_final("r9", answer)
    assert h.book.roots["r0"].final_op_id == answer


def test_bundle_round_trips_the_final_op(tmp_path: Path) -> None:
    lg = _ledger()
    lg.set_root_final("t", "a", "a/0")
    trace = lg.load_trace("t")
    first = export_bundle(trace, lg.cas, tmp_path / "one")
    back = import_bundle(first)
    assert {r.root_id: r.final_op_id for r in back.trace.roots} == {"a": "a/0", "b": None}
    second = export_bundle(back.trace, back.store, tmp_path / "two")
    assert (first / "trace.jsonl").read_bytes() == (second / "trace.jsonl").read_bytes()
