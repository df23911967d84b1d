"""The bench modules' docstring examples run."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "maserve_prefect.bench.suite",
    "maserve_prefect.bench.runner",
    "maserve_prefect.bench.serve",
    "maserve_prefect.bench.flow",
    "maserve_prefect.bench.pool.suite_file",
    "maserve_prefect.bench.pool.tables",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
