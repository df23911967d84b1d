"""The `Examples:` blocks of the bindings and tools modules run as written."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "maserve_prefect.bindings",
    *(
        f"maserve_prefect.bindings.{m}"
        for m in ("base", "content", "code_tasks", "finance", "math_word", "meeting_gen",
                  "meeting_summary", "research", "science_qa")
    ),
    *(f"maserve_prefect.tools.{m}" for m in ("", "builtin", "registry", "retrieval", "sandbox")),
]  # fmt: skip


@pytest.mark.parametrize("name", [m.rstrip(".") for m in MODULES])
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
