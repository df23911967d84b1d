"""Project-wide test fixtures."""

from __future__ import annotations

import os
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


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[None]:
    """A temporary local Prefect server (real API, temporary database) for the whole session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
