"""Project-wide test fixtures, the `prefect` marker, and the shared test helpers' folder.

Test modules import helpers by module name (pytest's `prepend` import mode puts each test file's
folder on `sys.path`; there are no `__init__.py` files under `tests/`). A folder's own factories
sit beside its tests (`spec_factories.py`); helpers that tests in several folders use live in
`tests/factories/`, which is put on `sys.path` here, so a test file imports them the same way
whatever else is collected with it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

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


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the marker must be there by then
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that needs the Prefect server (directly or through another fixture,
    `usefixtures` included) `prefect`, so `-m "not prefect"` is the fast loop."""
    for item in items:
        if PREFECT_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.prefect)


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[None]:
    """A temporary local Prefect server (real API, temporary database) for the whole session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
