"""The hear modules' docstring examples run."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "maserve_prefect.protocol.subjects",
    "maserve_prefect.protocol.intents",
    "maserve_prefect.protocol.controls",
    "maserve_prefect.protocol.state",
    "maserve_prefect.protocol.outcomes",
    "maserve_prefect.protocol.capabilities",
    "maserve_prefect.protocol.force",
    "maserve_prefect.protocol.messages",
    "maserve_prefect.protocol.channel",
    "maserve_prefect.protocol.fake",
    "maserve_prefect.protocol.views",
    "maserve_prefect.hear.policies",
    "maserve_prefect.hear.modemap",
    "maserve_prefect.hear.mode_calibration",
    "maserve_prefect.hear.overhead",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
