"""The pool-plan modules' docstring examples run (the seam, the snapshot, a round, the joint
plan, pool-mode dispatch); `test_pool_dispatch` runs the controller's and the executor's."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "maserve_prefect.runtime.pool_handle",
    "maserve_prefect.runtime.pool_snapshot",
    "maserve_prefect.runtime.plan_round",
    "maserve_prefect.runtime.joint_plan",
    "maserve_prefect.runtime.pool_dispatch",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
