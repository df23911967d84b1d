"""The runtime modules' docstring examples run (`test_pool_dispatch` runs the pool controller's
and the executor's)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "maserve_prefect.pool.constructor",
    "maserve_prefect.pool.fusion",
    "maserve_prefect.pool.memory_ledger",
    "maserve_prefect.pool.joint_plan",
    "maserve_prefect.pool.plan_round",
    "maserve_prefect.dispatch.plans",
    "maserve_prefect.pool.dispatch",
    "maserve_prefect.pool.handle",
    "maserve_prefect.pool.inputs",
    "maserve_prefect.pool.snapshot",
    "maserve_prefect.taskrunner.opsubmit",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
