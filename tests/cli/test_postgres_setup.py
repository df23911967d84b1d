"""The shared set-up on a real PostgreSQL server: the Prefect server's database
(`PREFECT_API_DATABASE_CONNECTION_URL`, asyncpg) and the trace ledger (`--ledger`, psycopg)
both on it. `maserve run` starts the managed Prefect server on PostgreSQL, records a native run,
and checks ops ↔ task runs one to one (exit 3 otherwise); the test then counts both in
PostgreSQL itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from maserve_prefect.postgres_server import LocalPostgres
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.ledger import Ledger

RUN_TIMEOUT_S = 600
URL = "http://127.0.0.1:4242/api"  # a managed server's API URL, for its environment


@pytest.mark.slow
def test_prefect_server_and_ledger_both_on_postgresql(
    local_postgres: LocalPostgres, tmp_path: Path
) -> None:
    ledger_url = local_postgres.create_database("shared_ledger")
    local_postgres.create_database("shared_prefect")
    prefect_db = local_postgres.url("shared_prefect", driver="asyncpg")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API_")}
    env.update(
        MASERVE_HOME=str(tmp_path / "home"),
        PREFECT_HOME=str(tmp_path / "prefect-client"),
        PREFECT_API_DATABASE_CONNECTION_URL=prefect_db,
    )
    cli = [str(Path(sys.executable).with_name("maserve"))]
    out = str(tmp_path / "bundle")
    try:
        run = subprocess.run(
            [*cli, "run", "fork_join", "--users", "2", "--ledger", ledger_url, "--out", out],
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
    finally:
        subprocess.run([*cli, "server", "stop"], env=env, capture_output=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    with Ledger(ledger_url, MemoryStore()) as ledger:
        (info,) = ledger.list_runs()
        ops = ledger.load_trace(info.trace_id).ops
    assert ledger_url.startswith("postgresql+psycopg://") and len(ops) > 0
    dsn = f"host=127.0.0.1 port={local_postgres.port} user=maserve dbname=shared_prefect"
    with psycopg.connect(dsn) as conn:
        flow_run = conn.execute("SELECT count(*) FROM flow_run").fetchone()
        # the ops' task runs: those of the roots' flow runs (the run's parent flow run holds
        # one more per root, Prefect's link to the root's subflow; it is not an op)
        task_runs = conn.execute(
            "SELECT count(*) FROM task_run t JOIN flow_run r ON t.flow_run_id = r.id "
            "JOIN flow f ON r.flow_id = f.id "
            "WHERE t.state_type = 'COMPLETED' AND f.name = 'maserve-root'"
        ).fetchone()
        trackers = conn.execute(
            "SELECT count(*) FROM flow_run WHERE parent_task_run_id IS NOT NULL"
        ).fetchone()
    assert flow_run is not None and flow_run[0] >= 1
    assert task_runs is not None and task_runs[0] == len(ops)  # Prefect's history is in PostgreSQL
    assert trackers is not None and trackers[0] == 2  # both roots are subflows of the run


def test_managed_server_on_postgresql_waits_for_a_connection_instead_of_failing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """1,000 roots released at once exhausted Prefect's default pool (HTTP 500, not retried)."""
    from maserve_prefect import prefect_server

    monkeypatch.delenv("PREFECT_API_DATABASE_CONNECTION_URL", raising=False)
    for name in prefect_server.POSTGRES_POOL:
        monkeypatch.delenv(name, raising=False)
    assert not set(prefect_server.POSTGRES_POOL) & set(
        prefect_server._server_env(tmp_path, URL, True)
    )

    monkeypatch.setenv("PREFECT_API_DATABASE_CONNECTION_URL", "postgresql+asyncpg://u@h/db")
    monkeypatch.setenv("PREFECT_SERVER_DATABASE_SQLALCHEMY_POOL_SIZE", "7")  # the user's own wins
    env = prefect_server._server_env(tmp_path, URL, True)
    assert env["PREFECT_SERVER_DATABASE_SQLALCHEMY_POOL_SIZE"] == "7"
    assert env["PREFECT_SERVER_DATABASE_SQLALCHEMY_MAX_OVERFLOW"] == "40"
    assert float(env["PREFECT_SERVER_DATABASE_SQLALCHEMY_POOL_TIMEOUT"]) >= 300
