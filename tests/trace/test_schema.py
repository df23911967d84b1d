"""The ledger's schema version (`trace.schema`) and `maserve ledger status|migrate`, on SQLite
and on a real PostgreSQL server: stamped on creation, older databases upgraded in place with
their rows kept, newer ones refused with nothing written, concurrent first opens safe."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from sqlalchemy import create_engine, inspect, text
from typer.testing import CliRunner

from maserve_prefect.cli import _mount, app
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, RootRecord
from maserve_prefect.trace.schema import (
    LEDGER_SCHEMA_VERSION,
    MIGRATIONS,
    LedgerSchemaError,
    read_version,
)

runner = CliRunner()
_mount()


def _record_one(url: str) -> None:
    with Ledger(url, MemoryStore()) as ledger:
        ledger.begin_run(Manifest(trace_id="t"))
        ledger.add_root("t", RootRecord(root_id="r"))
        ledger.append_op("t", OpRecord(op_id="r/a", root_id="r", kind=OpKind.MODEL))


def _make_unversioned_v1(url: str) -> None:
    """What a ledger written before versions and both added columns looks like."""
    engine = create_engine(url)
    with engine.begin() as conn:
        for step in MIGRATIONS:
            conn.exec_driver_sql(
                f"ALTER TABLE {step.table.__tablename__} DROP COLUMN {step.column}"
            )
        conn.exec_driver_sql("DROP TABLE trace_schema")
    engine.dispose()


def _cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, " ".join(result.output.split())  # rich wraps long lines


def test_a_new_ledger_is_stamped_with_the_current_version(ledger_url: str) -> None:
    ledger = Ledger(ledger_url, MemoryStore())
    assert read_version(ledger.engine) == LEDGER_SCHEMA_VERSION
    with ledger.engine.connect() as conn:
        rows = conn.execute(text("SELECT id, version FROM trace_schema")).all()
    assert [tuple(r) for r in rows] == [(1, LEDGER_SCHEMA_VERSION)]
    ledger.close()


def test_an_unversioned_old_ledger_is_upgraded_in_place_keeping_its_rows(
    durable_ledger_url: str,
) -> None:
    url = durable_ledger_url
    _record_one(url)
    _make_unversioned_v1(url)

    code, out = _cli("ledger", "status", "--url", url, "--json")
    assert code == 0, out
    status = json.loads(out)
    assert (status["schema_version"], status["state"]) == (1, "needs upgrade")
    assert status["pending"] == [m.name for m in MIGRATIONS]

    code, out = _cli("ledger", "migrate", "--url", url, "--check")
    assert code == 0, out
    assert "would apply: trace_op.tool_wall_s" in out
    engine = create_engine(url)
    assert "owner" not in {c["name"] for c in inspect(engine).get_columns("trace_run")}  # untouched

    code, out = _cli("ledger", "migrate", "--url", url)
    assert code == 0, out
    assert f"version 1 → version {LEDGER_SCHEMA_VERSION}" in out
    assert read_version(engine) == LEDGER_SCHEMA_VERSION
    engine.dispose()
    with Ledger(url, MemoryStore()) as ledger:
        assert [o.op_id for o in ledger.load_trace("t").ops] == ["r/a"]
    code, out = _cli("ledger", "migrate", "--url", url)
    assert "already at version" in out


def test_a_newer_ledger_is_refused_and_nothing_is_written(durable_ledger_url: str) -> None:
    url = durable_ledger_url
    _record_one(url)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE trace_schema SET version = :v"), {"v": LEDGER_SCHEMA_VERSION + 1})
        # a table the newer code no longer has: it must not be re-created
        conn.exec_driver_sql("DROP TABLE trace_engine_sample")

    with pytest.raises(
        LedgerSchemaError, match=rf"schema version {LEDGER_SCHEMA_VERSION + 1}.*nothing was written"
    ):
        Ledger(url, MemoryStore())
    code, out = _cli("ledger", "migrate", "--url", url)
    assert code == 1
    assert "newer than this maserve-prefect" in out

    assert read_version(engine) == LEDGER_SCHEMA_VERSION + 1
    assert "trace_engine_sample" not in inspect(engine).get_table_names()  # not re-created
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM trace_op")).scalar_one() == 1
    engine.dispose()


OPEN_AT_ONCE = textwrap.dedent(
    """
    import sys, time
    from maserve_prefect.trace.cas import MemoryStore
    from maserve_prefect.trace.ledger import Ledger
    url, start_at = sys.argv[1], float(sys.argv[2])
    time.sleep(max(0.0, start_at - time.time()))
    Ledger(url, MemoryStore()).close()
    print("ok")
    """
)


def test_four_processes_opening_a_new_ledger_at_once_create_it_once(
    durable_ledger_url: str,
) -> None:
    import time

    start_at = time.time() + 8.0  # after every child has imported the package
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_AT_ONCE, durable_ledger_url, str(start_at)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err for _, err in outs]
    engine = create_engine(durable_ledger_url)
    assert read_version(engine) == LEDGER_SCHEMA_VERSION
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM trace_schema")).scalar_one() == 1
    engine.dispose()
