"""The engine concept modules' docstring examples run (modules with tests of their own run theirs
there: `openai.prompts`, `openai.metrics`, `sim.hear_side`, ...)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "maserve_prefect.engines.openai.retry",
    "maserve_prefect.engines.openai.kv_decode",
    "maserve_prefect.engines.openai.kv_residency",
    "maserve_prefect.engines.openai.metrics_parse",
    "maserve_prefect.engines.openai.metrics_report",
    "maserve_prefect.engines.vllm.server",
    "maserve_prefect.engines.vllm.server_config",
    "maserve_prefect.engines.vllm.process_group",
    "maserve_prefect.engines.sim.kv.block_pool",
    "maserve_prefect.engines.sim.kv.prefix_cache",
    "maserve_prefect.engines.sim.kv.manager",
    "maserve_prefect.engines.sim.hear.resolve",
    "maserve_prefect.engines.sim.pool.sim_pool",
    "maserve_prefect.engines.sim.pool.views",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
