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


@pytest.fixture
def toy_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    """The synthetic `toy` and `bg` workflows of `replay_factories.make_trace` as a Γ fork: their
    stages `s1` and `s2` are the two branches of one `parallel` node, so a barrier between their
    (independent) ops is stage-local (`replay.coordination`); every other workflow keeps its real
    Γ (none for an unknown name such as `chain`)."""
    from maserve_prefect.replay import coordination
    from maserve_prefect.spec.composition import Parallel

    real = coordination.workflow_composition
    monkeypatch.setattr(
        coordination,
        "workflow_composition",
        lambda w: Parallel(branches=("s1", "s2")) if w in ("toy", "bg") else real(w),
    )
