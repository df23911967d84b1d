"""The tool registry: registration, lookup errors, timing and failure capture; the calculator."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from maserve_prefect.errors import ConfigError
from maserve_prefect.tools import (
    ToolFailure,
    call_tool,
    get_tool,
    list_tools,
    register_tool,
    unregister_tool,
)


@pytest.fixture
def scratch_tool() -> Iterator[str]:
    name = "test_scratch_tool"

    @register_tool(name)
    def scratch(x: int) -> int:
        if x < 0:
            raise ToolFailure("negative input", output={"x": x})
        if x == 0:
            raise RuntimeError("boom")
        return x * 2

    yield name
    unregister_tool(name)


def test_builtin_tools_are_registered() -> None:
    assert {"run_tests", "doc_search", "web_search", "calculator"} <= set(list_tools())


def test_duplicate_registration_raises(scratch_tool: str) -> None:
    with pytest.raises(ConfigError, match="already registered"):
        register_tool(scratch_tool)(lambda: None)


def test_unknown_tool_lists_known_names() -> None:
    with pytest.raises(ConfigError, match=r"unknown tool 'nope'.*calculator"):
        get_tool("nope")
    with pytest.raises(ConfigError):
        call_tool("nope")


def test_call_tool_records_output_failures_and_duration(scratch_tool: str) -> None:
    ok = call_tool(scratch_tool, x=4)
    assert (ok.ok, ok.output, ok.error) == (True, 8, "")
    assert ok.duration_s >= 0
    failed = call_tool(scratch_tool, x=-1)
    assert (failed.ok, failed.output, failed.error) == (False, {"x": -1}, "negative input")
    crashed = call_tool(scratch_tool, x=0)
    assert not crashed.ok and crashed.error == "RuntimeError: boom"
    assert ok.to_payload() == call_tool(scratch_tool, x=4).to_payload()


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("2 * (3 + 4)", 14),
        ("10 / 4", 2.5),
        ("-2 ** 2", -4),
        ("max(3, 7) % 4", 3),
        ("sqrt(16)", 4.0),
    ],
)
def test_calculator_evaluates_arithmetic(expression: str, value: float) -> None:
    assert call_tool("calculator", expression=expression).output == value


@pytest.mark.parametrize(
    "expression", ["__import__('os')", "1 / 0", "2 ** 99999", "x + 1", "1 +", "'a' * 3"]
)
def test_calculator_refuses_non_arithmetic(expression: str) -> None:
    result = call_tool("calculator", expression=expression)
    assert not result.ok and result.error.startswith("calculator")
