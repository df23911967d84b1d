"""A tool op's measured wall duration: stored beside the record in the ledger, read back by
`Ledger.tool_wall_times`, and a database created before that column existed still opens."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, inspect

from maserve_prefect.errors import TraceNotFoundError
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, OpStatus, RootRecord
from maserve_prefect.trace.schema import (
    LEDGER_SCHEMA_VERSION,
    MIGRATIONS,
    ensure_schema,
    read_version,
)
from maserve_prefect.trace.tables import OpRow


def tool_op(n: int, *, attempt: int = 1, status: OpStatus = OpStatus.COMPLETED) -> OpRecord:
    return OpRecord(
        op_id=f"r0/tool{n}",
        root_id="r0",
        kind=OpKind.TOOL,
        tool_name="calculator",
        tool_duration_s=1.5,
        attempt=attempt,
        status=status,
    )


def started(ledger: Ledger) -> Ledger:
    ledger.begin_run(Manifest(trace_id="t"))
    ledger.add_root("t", RootRecord(root_id="r0"))
    return ledger


def test_tool_wall_round_trip_keeps_the_record_unchanged(ledger_url: str) -> None:
    ledger = started(Ledger(ledger_url, MemoryStore()))
    first = tool_op(0, status=OpStatus.FAILED)
    ledger.append_op("t", first, tool_wall_s=0.25)
    ledger.append_op("t", tool_op(0, attempt=2), tool_wall_s=0.125)
    ledger.append_op("t", tool_op(1))  # no measured wall time (e.g. an imported op)
    assert ledger.tool_wall_times("t") == {("r0/tool0", 1): 0.25, ("r0/tool0", 2): 0.125}
    # The record is exactly what was appended: the wall time lives only in the ledger row.
    assert ledger.load_trace("t").ops[0] == first


def test_tool_wall_rejects_bad_values_and_unknown_runs(ledger_url: str) -> None:
    ledger = started(Ledger(ledger_url, MemoryStore()))
    with pytest.raises(ValueError, match=r"op 'r0/tool0'.*tool_wall_s=-1.0"):
        ledger.append_op("t", tool_op(0), tool_wall_s=-1.0)
    with pytest.raises(TraceNotFoundError, match="'nope'"):
        ledger.tool_wall_times("nope")


def test_database_from_before_the_column_still_opens_and_gains_it(durable_ledger_url: str) -> None:
    url = durable_ledger_url
    with Ledger(url, MemoryStore()) as ledger:
        started(ledger).append_op("t", tool_op(0))
    old = create_engine(url)
    with old.begin() as conn:  # what a ledger written before the column looks like
        for step in MIGRATIONS:
            conn.exec_driver_sql(
                f"ALTER TABLE {step.table.__tablename__} DROP COLUMN {step.column}"
            )
        conn.exec_driver_sql("DROP TABLE trace_schema")  # written before versions were stamped
    assert "tool_wall_s" not in {c["name"] for c in inspect(old).get_columns("trace_op")}
    old.dispose()

    with Ledger(url, MemoryStore()) as reopened:
        assert [o.op_id for o in reopened.load_trace("t").ops] == ["r0/tool0"]
        reopened.append_op("t", tool_op(1), tool_wall_s=0.5)
        assert reopened.tool_wall_times("t") == {("r0/tool1", 1): 0.5}
        assert ensure_schema(reopened.engine).applied == ()  # already up to date: nothing to add
        assert read_version(reopened.engine) == LEDGER_SCHEMA_VERSION


def test_upgrade_reports_what_it_added(durable_ledger_url: str) -> None:
    url = durable_ledger_url
    Ledger(url, MemoryStore()).close()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE {OpRow.__tablename__} DROP COLUMN tool_wall_s")
        conn.exec_driver_sql("UPDATE trace_schema SET version = 1")
    report = ensure_schema(engine)
    assert (report.found, report.version) == (1, LEDGER_SCHEMA_VERSION)
    assert report.applied == ("trace_op.tool_wall_s",)  # owner was there: only what is missing
    assert "tool_wall_s" in {c["name"] for c in inspect(engine).get_columns("trace_op")}
    engine.dispose()
