"""The `Examples:` blocks in the spec package's docstrings run and pass."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import maserve_prefect.spec as spec_pkg

MODULES = [
    "maserve_prefect.spec",
    *sorted(
        m.name for m in pkgutil.walk_packages(spec_pkg.__path__, prefix="maserve_prefect.spec.")
    ),
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run_and_pass(name: str) -> None:
    module = importlib.import_module(name)
    assert any(t.examples for t in doctest.DocTestFinder().find(module)), f"{name} has no examples"
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
