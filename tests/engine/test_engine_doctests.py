"""The engine concept modules' docstring examples run (modules with tests of their own run theirs
there: `openai.prompts`, `openai.metrics`, `sim.hear_side`, ...)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "maserve_prefect.engine.openai.retry",
    "maserve_prefect.engine.openai.kv_decode",
    "maserve_prefect.engine.openai.kv_residency",
    "maserve_prefect.engine.openai.metrics_parse",
    "maserve_prefect.engine.openai.metrics_report",
    "maserve_prefect.engine.vllm.server",
    "maserve_prefect.engine.vllm.server_config",
    "maserve_prefect.engine.vllm.process_group",
    "maserve_prefect.engine.sim.kv_block_pool",
    "maserve_prefect.engine.sim.kv_prefix_cache",
    "maserve_prefect.engine.sim.kv_cache",
    "maserve_prefect.engine.sim.hear_resolve",
    "maserve_prefect.engine.sim.pool",
    "maserve_prefect.engine.sim.pool_views",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
