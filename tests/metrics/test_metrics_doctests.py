"""The metrics modules' docstring examples run."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "maserve_prefect.metrics.task",
    "maserve_prefect.metrics.path",
    "maserve_prefect.metrics.slo",
    "maserve_prefect.metrics.engine",
    "maserve_prefect.metrics.report",
    "maserve_prefect.replay.report",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
