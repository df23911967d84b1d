"""Project-wide test fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

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
