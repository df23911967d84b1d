"""A root that fails outside any op (e.g. a Prefect API call that timed out) says where."""

from __future__ import annotations

from typing import Any

import pytest
from maserve_prefect.flows import native
from maserve_prefect.flows.native import run_native

pytestmark = pytest.mark.usefixtures("prefect_api")


def test_a_root_failing_outside_any_op_reports_where_it_was_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = native._start_root

    def flaky(root_id: str, instance_id: str, run_key: str) -> dict[str, Any]:
        if root_id == "r0001":
            raise TimeoutError("timed out")  # as a Prefect API call past its retries
        return real(root_id, instance_id, run_key)

    monkeypatch.setattr(native, "_start_root", flaky)
    run = run_native("fork_join", users=2, seed=0)
    ok, bad = sorted(run.roots, key=lambda r: r.root_id)
    assert ok.error is None and ok.raised_at is None
    assert bad.error == "TimeoutError: timed out"
    assert bad.raised_at is not None and "test_root_raised_at.py" in bad.raised_at
    assert " flaky" in bad.raised_at.split(" <- ")[0]  # innermost frame first
