"""The doctests of the OpenAI backend's and the vLLM server's concept modules run and pass.

The older modules of these packages run theirs in their own test files (`test_openai_prompts.py`,
`test_kv_events.py`); this file covers the modules split out of them, which have no test file of
their own for doctests.
"""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize(
    "name",
    [
        "maserve_prefect.engine.openai.retry",
        "maserve_prefect.engine.openai.kv_decode",
        "maserve_prefect.engine.openai.kv_residency",
        "maserve_prefect.engine.vllm.server",
        "maserve_prefect.engine.vllm.server_config",
        "maserve_prefect.engine.vllm.process_group",
    ],
)
def test_module_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
