"""The hear modules' docstring examples run."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "maserve_prefect.hear.subjects",
    "maserve_prefect.hear.intents",
    "maserve_prefect.hear.controls",
    "maserve_prefect.hear.state",
    "maserve_prefect.hear.outcomes",
    "maserve_prefect.hear.capabilities",
    "maserve_prefect.hear.force",
    "maserve_prefect.hear.messages",
    "maserve_prefect.hear.channel",
    "maserve_prefect.hear.reference",
    "maserve_prefect.hear.views",
    "maserve_prefect.hear.policies",
    "maserve_prefect.hear.modemap",
    "maserve_prefect.hear.mode_calibration",
    "maserve_prefect.hear.overhead",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
