"""The pool suite's file and report modules' docstring examples run (`test_pool_suite` runs the
suite module's own)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "maserve_prefect.bench.pool_suite_file",
    "maserve_prefect.bench.pool_tables",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
