"""A tool op's measured wall duration: stored beside the record in the ledger, read back by
`Ledger.tool_wall_times`, and a database created before that column existed still opens."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect

from maserve_prefect.errors import TraceNotFoundError
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, OpStatus, RootRecord
from maserve_prefect.trace.tables import ADDED_COLUMNS, OpRow, upgrade_tables


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


def test_tool_wall_round_trip_keeps_the_record_unchanged() -> None:
    ledger = started(Ledger("sqlite://", MemoryStore()))
    first = tool_op(0, status=OpStatus.FAILED)
    ledger.append_op("t", first, tool_wall_s=0.25)
    ledger.append_op("t", tool_op(0, attempt=2), tool_wall_s=0.125)
    ledger.append_op("t", tool_op(1))  # no measured wall time (e.g. an imported op)
    assert ledger.tool_wall_times("t") == {("r0/tool0", 1): 0.25, ("r0/tool0", 2): 0.125}
    # The record is exactly what was appended: the wall time lives only in the ledger row.
    assert ledger.load_trace("t").ops[0] == first


def test_tool_wall_rejects_bad_values_and_unknown_runs() -> None:
    ledger = started(Ledger("sqlite://", MemoryStore()))
    with pytest.raises(ValueError, match=r"op 'r0/tool0'.*tool_wall_s=-1.0"):
        ledger.append_op("t", tool_op(0), tool_wall_s=-1.0)
    with pytest.raises(TraceNotFoundError, match="'nope'"):
        ledger.tool_wall_times("nope")


def test_database_from_before_the_column_still_opens_and_gains_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/old.db"
    with Ledger(url, MemoryStore()) as ledger:
        started(ledger).append_op("t", tool_op(0))
    old = create_engine(url)
    with old.begin() as conn:  # what a ledger written before the column looks like
        for table, name in ADDED_COLUMNS:
            conn.exec_driver_sql(f"ALTER TABLE {table.__tablename__} DROP COLUMN {name}")
    assert "tool_wall_s" not in {c["name"] for c in inspect(old).get_columns("trace_op")}
    old.dispose()

    with Ledger(url, MemoryStore()) as reopened:
        assert [o.op_id for o in reopened.load_trace("t").ops] == ["r0/tool0"]
        reopened.append_op("t", tool_op(1), tool_wall_s=0.5)
        assert reopened.tool_wall_times("t") == {("r0/tool1", 1): 0.5}
        assert upgrade_tables(reopened.engine) == []  # already up to date: nothing to add


def test_upgrade_reports_what_it_added(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/old.db"
    Ledger(url, MemoryStore()).close()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE {OpRow.__tablename__} DROP COLUMN tool_wall_s")
    assert upgrade_tables(engine) == ["trace_op.tool_wall_s"]
    assert "tool_wall_s" in {c["name"] for c in inspect(engine).get_columns("trace_op")}
    engine.dispose()
