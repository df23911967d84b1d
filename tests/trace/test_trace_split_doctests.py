"""The docstring examples of the ledger, its run values, barriers and release rules run, and each
module has some (the barrier and run-value modules were split out of `release` and `ledger`)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "maserve_prefect.trace.ledger",
    "maserve_prefect.trace.runs",
    "maserve_prefect.trace.barrier",
    "maserve_prefect.trace.release",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    module = importlib.import_module(name)
    assert any(t.examples for t in doctest.DocTestFinder().find(module)), f"{name} has no examples"
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_ledger_still_exports_its_run_values() -> None:
    from maserve_prefect.trace import ledger, runs

    for name in ("PrefectLink", "RunInfo", "RunStatus"):
        assert name in ledger.__all__ and getattr(ledger, name) is getattr(runs, name)
