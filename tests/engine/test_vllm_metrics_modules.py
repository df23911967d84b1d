"""The doctests of the metrics parser and the timeline window reads run and pass.

Both were split out of `engine/openai/metrics.py`, whose own doctests (the scraper's) run in
`test_vllm_metrics.py`, next to the behaviour tests of all three modules.
"""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize(
    "name",
    [
        "maserve_prefect.engine.openai.metrics_parse",
        "maserve_prefect.engine.openai.metrics_report",
    ],
)
def test_module_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
