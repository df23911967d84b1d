"""Fixtures for replay tests: real native DAG traces, realized through Prefect once per session."""

from __future__ import annotations

import pytest

from maserve_prefect.trace.cas import BlobStore
from maserve_prefect.trace.model import Trace


@pytest.fixture(scope="session")
def four_call(prefect_api: None) -> tuple[Trace, BlobStore]:
    """A native four_call_full run (analysts in parallel, then synthesis, then verification)."""
    from maserve_prefect.flows.native import run_native

    run = run_native("four_call_full", users=3, seed=0)
    return run.trace, run.harness.store


@pytest.fixture(scope="session")
def code_repair(prefect_api: None) -> tuple[Trace, BlobStore]:
    """A native code_repair run: model ops and tool ops (run_tests) with recorded durations."""
    from maserve_prefect.flows.native import run_native

    run = run_native("code_repair", users=2, seed=0)
    return run.trace, run.harness.store
