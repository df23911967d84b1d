"""The ledger's schema version: stamped in the database, upgraded in place, never downgraded.

The one idea: **a one-row table `trace_schema` holds the version the database was last written
at, and opening a ledger compares it with `LEDGER_SCHEMA_VERSION` before writing anything.**

- An empty database gets every table and the current version.
- An older one is upgraded in place by the `MIGRATIONS` it lacks, oldest first, in one
  transaction with the new version stamp: it ends at the new version or stays as it was.
- A database written before versions were stamped (no `trace_schema`, ledger tables present)
  is version 1 plus whichever migrations' columns it already has; it is upgraded the same way.
- A newer one (written by a later maserve-prefect) is refused with `LedgerSchemaError` before
  anything is created or altered: code that does not know a column must not write rows without it.

Two processes may open one database at once. The schema step holds a lock for its whole
transaction: `pg_advisory_xact_lock` on PostgreSQL (released at commit or rollback, also when the
process dies) and an `flock` beside the file on SQLite (`maserve_prefect.locks`); an in-memory
SQLite database has one connection and needs none.

`maserve ledger migrate` runs the same step explicitly and reports it (`--check` only reads).

Examples:
    >>> from maserve_prefect.trace.db import memory_engine
    >>> read_version(memory_engine()) == LEDGER_SCHEMA_VERSION
    True
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Connection, inspect, text
from sqlalchemy.engine import Engine
from sqlmodel import Field, SQLModel

from maserve_prefect.errors import ConfigError
from maserve_prefect.locks import exclusive
from maserve_prefect.trace.tables import LEDGER_TABLES, OpRow, RunRow

__all__ = [
    "LEDGER_SCHEMA_VERSION",
    "MIGRATIONS",
    "LedgerSchemaError",
    "Migration",
    "SchemaReport",
    "ensure_schema",
    "pending_migrations",
    "read_version",
]

SCHEMA_TABLE = "trace_schema"
PG_LOCK_KEY = 0x6D61_7365_7276_65  # "maserve": one advisory lock for every ledger schema step
SQLITE_LOCK_WAIT_S = 120.0


class LedgerSchemaError(ConfigError):
    """The database's schema is newer than this code, or cannot be upgraded."""


@dataclass(frozen=True, slots=True)
class Migration:
    """One step up: the version it reaches and the nullable column it adds.

    Attributes:
        version: the schema version after this step.
        table: the table's model.
        column: the column added (nullable: rows written before read it as None).
        why: one line for `maserve ledger migrate`.
    """

    version: int
    table: type[SQLModel]
    column: str
    why: str

    @property
    def name(self) -> str:
        return f"{self.table.__tablename__}.{self.column}"


MIGRATIONS: tuple[Migration, ...] = (
    Migration(2, OpRow, "tool_wall_s", "a tool op's measured wall duration"),
    Migration(3, RunRow, "owner", "the recording process, so a run left running is found crashed"),
)
"""Every step after version 1 (the first release), oldest first."""

LEDGER_SCHEMA_VERSION = MIGRATIONS[-1].version if MIGRATIONS else 1
"""The version this code reads and writes."""


class SchemaVersionRow(SQLModel, table=True):
    """The database's schema version (one row, id 1)."""

    __tablename__ = SCHEMA_TABLE

    id: int = Field(default=1, primary_key=True)
    version: int
    migrated_at: str


@dataclass(frozen=True, slots=True)
class SchemaReport:
    """What a schema step found and did.

    Attributes:
        found: the version before (None: an empty database).
        version: the version after.
        applied: the migrations applied, oldest first (their `name`s).
        created: whether the ledger tables were created (an empty database).
    """

    found: int | None
    version: int
    applied: tuple[str, ...]
    created: bool


def read_version(engine: Engine) -> int | None:
    """The database's schema version, without writing: None for a database with no ledger."""
    with engine.connect() as conn:
        return _found_version(conn)


def ensure_schema(engine: Engine, *, check_only: bool = False) -> SchemaReport:
    """Create or upgrade the ledger's tables to `LEDGER_SCHEMA_VERSION`, under the schema lock.

    Args:
        engine: the ledger database.
        check_only: report what would be done, write nothing.

    Raises:
        LedgerSchemaError: the database is newer than this code (nothing is written).
    """
    with _schema_lock(engine), engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_LOCK_KEY})
        found = _found_version(conn)
        if found is not None and found > LEDGER_SCHEMA_VERSION:
            raise LedgerSchemaError(
                f"ledger database {_where(engine)} has schema version {found}, newer than this "
                f"maserve-prefect writes ({LEDGER_SCHEMA_VERSION}); upgrade maserve-prefect "
                f"(pip install -U maserve-prefect) to use it; nothing was written"
            )
        todo = _pending(conn, found)
        if check_only:
            return SchemaReport(found, found or LEDGER_SCHEMA_VERSION, (), False)
        # Idempotent steps: a step interrupted on SQLite (where DDL is not transactional under
        # the driver) is completed by the next open, which finds what is still missing.
        tables = [t.__table__ for t in (*LEDGER_TABLES, SchemaVersionRow)]  # type: ignore[attr-defined]
        SQLModel.metadata.create_all(conn, tables=tables)
        for step in todo:
            _add_column(conn, step)
        if found != LEDGER_SCHEMA_VERSION or not _stamped(conn):
            conn.execute(text(f"DELETE FROM {SCHEMA_TABLE}"))
            conn.execute(
                text(f"INSERT INTO {SCHEMA_TABLE} (id, version, migrated_at) VALUES (1, :v, :t)"),
                {"v": LEDGER_SCHEMA_VERSION, "t": datetime.now(UTC).isoformat()},
            )
        return SchemaReport(
            found, LEDGER_SCHEMA_VERSION, tuple(s.name for s in todo), created=found is None
        )


def pending_migrations(engine: Engine) -> list[Migration]:
    """The migrations the database lacks (none for an empty one: it is created current)."""
    with engine.connect() as conn:
        return _pending(conn, _found_version(conn))


def _found_version(conn: Connection) -> int | None:
    names = set(inspect(conn).get_table_names())
    if SCHEMA_TABLE in names:
        row = conn.execute(text(f"SELECT version FROM {SCHEMA_TABLE} WHERE id = 1")).first()
        if row is not None:
            return int(row[0])
    ledger = {t.__tablename__ for t in LEDGER_TABLES}
    if not names & ledger:
        return None
    # Written before versions were stamped: version 1 plus the migrations already present.
    version = 1
    for step in MIGRATIONS:
        if not _has_column(conn, step):
            break
        version = step.version
    return version


def _stamped(conn: Connection) -> bool:
    if SCHEMA_TABLE not in inspect(conn).get_table_names():
        return False
    return conn.execute(text(f"SELECT 1 FROM {SCHEMA_TABLE} WHERE id = 1")).first() is not None


def _pending(conn: Connection, found: int | None) -> list[Migration]:
    if found is None:
        return []
    return [s for s in MIGRATIONS if not _has_column(conn, s)]


def _has_column(conn: Connection, step: Migration) -> bool:
    table = step.table.__tablename__
    if table not in inspect(conn).get_table_names():
        return False
    return step.column in {c["name"] for c in inspect(conn).get_columns(table)}


def _add_column(conn: Connection, step: Migration) -> None:
    table = step.table.__table__  # type: ignore[attr-defined]
    prep = conn.dialect.identifier_preparer
    column_type = table.c[step.column].type.compile(dialect=conn.dialect)
    conn.exec_driver_sql(
        f"ALTER TABLE {prep.quote(table.name)} ADD COLUMN {prep.quote(step.column)} {column_type}"
    )


@contextlib.contextmanager
def _schema_lock(engine: Engine) -> Iterator[None]:
    url = engine.url
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        db_file = Path(url.database).expanduser()
        lock = db_file.with_name(db_file.name + ".schema.lock")
        with exclusive(lock, wait_s=SQLITE_LOCK_WAIT_S, what=f"the ledger schema of {db_file}"):
            yield
    else:
        yield  # PostgreSQL: the advisory lock taken inside the transaction; memory: one connection


def _where(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=True)
