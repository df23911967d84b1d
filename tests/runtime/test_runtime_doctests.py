"""The runtime modules' docstring examples run (`test_pool_dispatch` runs the pool controller's
and the executor's)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "maserve_prefect.runtime.constructor",
    "maserve_prefect.runtime.fusion",
    "maserve_prefect.runtime.memory_ledger",
    "maserve_prefect.runtime.joint_plan",
    "maserve_prefect.runtime.plan_round",
    "maserve_prefect.runtime.plans",
    "maserve_prefect.runtime.pool_dispatch",
    "maserve_prefect.runtime.pool_handle",
    "maserve_prefect.runtime.pool_inputs",
    "maserve_prefect.runtime.pool_snapshot",
    "maserve_prefect.runtime.opsubmit",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
