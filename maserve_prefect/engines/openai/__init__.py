"""The OpenAI-compatible backend: `OpenAIEngine`, a `Replica` over one vLLM (or any
OpenAI-compatible) endpoint, with capability discovery and the request mapping beside it.

The names below are imported lazily so that importing a sibling module (e.g. the metrics
scraper) does not pay for importing the `openai` client.

Examples:
    >>> from maserve_prefect.engines.openai import synth_token_ids
    >>> len(synth_token_ids(10, (), 0, vocab_size=64, salt="r"))
    10
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from maserve_prefect.engines.openai.discovery import ServerInfo, discover
    from maserve_prefect.engines.openai.engine import OpenAIEngine
    from maserve_prefect.engines.openai.prompts import build_call, synth_token_ids
    from maserve_prefect.engines.openai.retry import RetryPolicy

_WHERE = {
    "OpenAIEngine": "engine",
    "RetryPolicy": "retry",
    "ServerInfo": "discovery",
    "discover": "discovery",
    "build_call": "prompts",
    "synth_token_ids": "prompts",
}

__all__ = [
    "OpenAIEngine",
    "RetryPolicy",
    "ServerInfo",
    "build_call",
    "discover",
    "synth_token_ids",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
