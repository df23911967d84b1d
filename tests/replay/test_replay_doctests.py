"""The replay modules' docstring examples run, and those of the modules replay owns elsewhere
(release rules, the real-engine drain)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "maserve_prefect.workloads.arrivals",
    "maserve_prefect.replay.work",
    "maserve_prefect.replay.audit",
    "maserve_prefect.replay.driver",
    "maserve_prefect.replay.scenario",
    "maserve_prefect.replay.traceset",
    "maserve_prefect.replay.arms",
    "maserve_prefect.replay.arm_summary",
    "maserve_prefect.trace.release",
    "maserve_prefect.engines.openai.wall",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
