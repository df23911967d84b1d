"""The ledger's engine factory: the only module that knows which database is underneath.

`make_engine(url)` accepts any SQLAlchemy URL (default: `Settings.ledger_url`, SQLite under
`MASERVE_HOME`) and creates the ledger tables. Everything else in `trace/` uses portable
SQLAlchemy, so pointing `MASERVE_LEDGER_URL` at PostgreSQL is the whole migration.

SQLite specifics live here and nowhere else:

- file databases get `journal_mode=WAL` (readers never block the writer) and `synchronous=FULL`
  (each commit is fsynced, so an op appended is on disk when `Ledger.append_op` returns), plus a
  busy timeout so a second process waits for the write lock instead of failing;
- `sqlite://` (in memory) uses one shared connection (`StaticPool`) so every session and thread
  sees the same database — what tests use when durability is not the point;
- the folder of a file database is created on first use (mode 0700 for folders it creates), and
  the file itself mode 0600 (`settings.private_dir` / `private_file`).

Examples:
    >>> from sqlalchemy import inspect
    >>> engine = make_engine("sqlite://")
    >>> sorted(inspect(engine).get_table_names())[:2]
    ['trace_edge', 'trace_engine_sample']
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import StaticPool
from sqlmodel import create_engine

from maserve_prefect.errors import ConfigError
from maserve_prefect.settings import get_settings, private_dir, private_file
from maserve_prefect.trace.schema import ensure_schema

SQLITE_BUSY_TIMEOUT_MS = 30_000

__all__ = ["create_tables", "is_memory_sqlite", "make_engine", "memory_engine"]


def is_memory_sqlite(url: URL) -> bool:
    """Whether `url` names an in-memory SQLite database."""
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


def make_engine(url: str | URL | None = None, *, echo: bool = False) -> Engine:
    """Open the ledger database at `url` and make sure its tables exist.

    Args:
        url: a SQLAlchemy URL; `None` uses `get_settings().ledger_url`.
        echo: log SQL (debugging).

    Raises:
        ConfigError: `url` is not a database URL.

    Examples:
        >>> make_engine("sqlite://").dialect.name
        'sqlite'
    """
    raw = get_settings().ledger_url if url is None else url
    try:
        parsed = make_url(raw)
    except ArgumentError as exc:
        raise ConfigError(
            f"ledger URL {raw!r} is not a database URL ({exc}); use e.g. "
            f"'sqlite:////abs/path/ledger.db' or 'postgresql+psycopg://user@host/db'"
        ) from exc

    kwargs: dict[str, Any] = {"echo": echo}
    if parsed.get_backend_name() == "sqlite":
        kwargs["connect_args"] = {"check_same_thread": False}
        if is_memory_sqlite(parsed):
            kwargs["poolclass"] = StaticPool
        else:
            assert parsed.database is not None
            db_file = Path(parsed.database).expanduser()
            try:
                private_file(private_dir(db_file.parent) / db_file.name)
            except OSError as exc:
                raise ConfigError(
                    f"ledger database {db_file}: cannot create it ({exc.strerror or exc}); set "
                    "MASERVE_HOME or MASERVE_LEDGER_URL to a folder you can write"
                ) from None
    engine = create_engine(parsed, **kwargs)
    if parsed.get_backend_name() == "sqlite":
        _install_sqlite_pragmas(engine, wal=not is_memory_sqlite(parsed))
    try:
        create_tables(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine


def memory_engine() -> Engine:
    """A fresh in-memory SQLite ledger (one shared connection) — for tests and dry runs."""
    return make_engine("sqlite://")


def create_tables(engine: Engine) -> None:
    """Create missing ledger tables and upgrade an older schema in place (`trace.schema`).

    Raises:
        LedgerSchemaError: the database's schema is newer than this code (nothing written).
    """
    ensure_schema(engine)


def _install_sqlite_pragmas(engine: Engine, *, wal: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        try:
            if wal:
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        finally:
            cur.close()
