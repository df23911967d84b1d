"""Shared fixtures for metrics tests: one native fork-join run on the simulator."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def native_run(prefect_api: None) -> Any:
    """`run_native("fork_join", users=4, seed=0)` once per session (trace + SimPool)."""
    from maserve_prefect.flows.native import run_native

    return run_native("fork_join", users=4, seed=0)
