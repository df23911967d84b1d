"""The docstring examples of fusion, the memory ledger and the constructor's lifecycle options
run, and each module has some."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "maserve_prefect.runtime.fusion",
    "maserve_prefect.runtime.memory_ledger",
    "maserve_prefect.runtime.constructor",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    module = importlib.import_module(name)
    assert any(t.examples for t in doctest.DocTestFinder().find(module)), f"{name} has no examples"
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
