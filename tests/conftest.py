"""Project-wide test fixtures, the `prefect` marker, and the shared test helpers' folder.

Test modules import helpers by module name (pytest's `prepend` import mode puts each test file's
folder on `sys.path`; there are no `__init__.py` files under `tests/`). A folder's own factories
sit beside its tests (`spec_factories.py`); helpers that tests in several folders use live in
`tests/factories/`, which is put on `sys.path` here, so a test file imports them the same way
whatever else is collected with it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported inside the fixtures, after the Prefect settings below are set
    from maserve_prefect.postgres_server import LocalPostgres

# Prefect reads its settings at import: keep tests off the user's ~/.prefect and quiet.
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="maserve-test-prefect-"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_LOGGING_TO_API_ENABLED", "false")
os.environ.setdefault("MASERVE_HOME", tempfile.mkdtemp(prefix="maserve-test-home-"))

FACTORIES = Path(__file__).resolve().parent / "factories"
if str(FACTORIES) not in sys.path:
    sys.path.insert(0, str(FACTORIES))

# The shared data folder sits beside the project root: <root>/../shared/data.
SHARED_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared read-only data folder (`../shared/data` from the project root)."""
    if not SHARED_DATA.is_dir():
        pytest.fail(
            f"shared data folder {SHARED_DATA.resolve()} is missing; tests need the shared "
            "checkout beside the project root (../shared/data)"
        )
    return SHARED_DATA.resolve()


PREFECT_FIXTURE = "prefect_api"


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[None]:
    """A temporary local Prefect server (real API, temporary database) for the whole session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


POSTGRES_FIXTURE = "local_postgres"
REQUIRE_POSTGRES = "MASERVE_REQUIRE_POSTGRES"
"""Set by `make test`: a missing PostgreSQL server fails its tests instead of skipping them."""


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the markers must be there by then
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests that need the Prefect server `prefect`, and those that need PostgreSQL
    `postgres` (directly or through another fixture), so `-m` can select either loop."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        if PREFECT_FIXTURE in names:
            item.add_marker(pytest.mark.prefect)
        if POSTGRES_FIXTURE in names:
            item.add_marker(pytest.mark.postgres)


@pytest.fixture(scope="session")
def local_postgres() -> Iterator[LocalPostgres]:
    """A real PostgreSQL server (Debian's binaries) in a temporary cluster, for the session."""
    from maserve_prefect.postgres_server import INSTALL_HINT, LocalPostgres, find_bin_dir

    if find_bin_dir() is None:
        why = f"PostgreSQL server binaries not found; {INSTALL_HINT}"
        if os.environ.get(REQUIRE_POSTGRES):
            pytest.fail(f"{why} ({REQUIRE_POSTGRES} is set)")
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="maserve-pg-"))
    server = LocalPostgres.start(root)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_url(local_postgres: LocalPostgres) -> str:
    """A new, empty database on the session's PostgreSQL server (psycopg URL)."""
    return local_postgres.create_database(f"t_{uuid.uuid4().hex[:16]}")


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest) -> str:
    """An empty ledger database: in-memory SQLite, then a new PostgreSQL database."""
    if request.param == "sqlite":
        return "sqlite://"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture(params=["sqlite-file", "postgresql"])
def durable_ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty ledger database that outlives its process: a SQLite file, then PostgreSQL."""
    if request.param == "sqlite-file":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url
