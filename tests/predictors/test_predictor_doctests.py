"""The predictors' docstring examples run and pass."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "base", "opgraph", "formula", "rows", "gbdt", "graph", "tables", "evaluate", "profiling",
    "measured",
]  # fmt: skip


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    module = importlib.import_module(f"maserve_prefect.predictors.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
