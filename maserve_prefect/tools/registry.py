"""The tool registry: named Python callables that a `tool_call` op runs, timed and recorded.

A tool is a plain function registered under a name with `@register_tool("name")`. `call_tool`
runs it, measures its duration with `time.perf_counter` and wraps what happened in a `ToolResult`
(output, ok, duration, error) — the record a trace stores as the tool op's output and
`tool_duration_s`. A tool signals a failure it understands (a timeout, a bad argument) by raising
`ToolFailure`; any other exception is also caught and reported, never swallowed silently: the
result carries the exception type and message.

Registering a name twice raises `ConfigError`; asking for an unknown name raises `ConfigError`
listing the known names (the registry holds no silent collisions).

Examples:
    >>> @register_tool("doctest_echo")
    ... def echo(text: str) -> str:
    ...     return text
    >>> result = call_tool("doctest_echo", text="hi")
    >>> (result.ok, result.output)
    (True, 'hi')
    >>> unregister_tool("doctest_echo")
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from maserve_prefect.errors import ConfigError, MaserveError

ToolFn = Callable[..., Any]

_REGISTRY: dict[str, ToolFn] = {}


class ToolFailure(MaserveError):
    """Raised by a tool for a failure it understands (timeout, bad argument).

    `output` is the partial output to keep in the `ToolResult` (e.g. captured stderr).
    """

    def __init__(self, message: str, output: Any = None) -> None:
        super().__init__(message)
        self.output = output


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What one tool call produced.

    Attributes:
        tool_name: the registered name that ran.
        output: the tool's return value (JSON-serializable), or partial output on failure.
        ok: True when the tool returned normally.
        duration_s: measured wall duration of the call (`time.perf_counter`).
        error: the failure message when `ok` is False, else "".
    """

    tool_name: str
    output: Any
    ok: bool
    duration_s: float
    error: str = ""

    def to_payload(self) -> bytes:
        """Deterministic JSON bytes for the content-addressed store (duration left out, since
        it is recorded on the op as `tool_duration_s`)."""
        body = {"tool": self.tool_name, "ok": self.ok, "output": self.output, "error": self.error}
        return json.dumps(body, sort_keys=True, separators=(",", ":"), default=str).encode()


def register_tool(name: str) -> Callable[[ToolFn], ToolFn]:
    """Decorator registering `fn` as the tool `name`; `ConfigError` if the name is taken.

    Examples:
        >>> @register_tool("doctest_add")
        ... def add(a: int, b: int) -> int:
        ...     return a + b
        >>> get_tool("doctest_add")(2, 3)
        5
        >>> unregister_tool("doctest_add")
    """
    if not name or not name.strip():
        raise ConfigError("tool name must be a non-empty string")

    def decorate(fn: ToolFn) -> ToolFn:
        if name in _REGISTRY:
            raise ConfigError(
                f"tool {name!r} is already registered (by {_REGISTRY[name].__qualname__}); "
                "pick another name or unregister the old tool first"
            )
        _REGISTRY[name] = fn
        return fn

    return decorate


def unregister_tool(name: str) -> None:
    """Remove the tool `name` (for tests and plugins that replace a tool)."""
    get_tool(name)
    del _REGISTRY[name]


def get_tool(name: str) -> ToolFn:
    """The tool registered as `name`; `ConfigError` listing the known names otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise ConfigError(
            f"unknown tool {name!r} (registered tools: {known}); register it with "
            "@register_tool or import the module that defines it"
        ) from None


def list_tools() -> list[str]:
    """Names of every registered tool, sorted."""
    return sorted(_REGISTRY)


def call_tool(name: str, /, **kwargs: Any) -> ToolResult:
    """Run the tool `name` with `kwargs`, timing it; failures come back as `ok=False`.

    An unknown name raises `ConfigError` (that is a configuration bug, not a tool failure).

    Examples:
        >>> from maserve_prefect.tools import call_tool
        >>> r = call_tool("calculator", expression="2 * (3 + 4)")
        >>> (r.ok, r.output, r.duration_s >= 0)
        (True, 14, True)
    """
    fn = get_tool(name)
    start = time.perf_counter()
    try:
        output = fn(**kwargs)
    except ToolFailure as exc:
        return ToolResult(name, exc.output, False, time.perf_counter() - start, str(exc))
    except Exception as exc:  # a tool bug or bad argument: report it, with its type
        message = f"{type(exc).__name__}: {exc}"
        return ToolResult(name, None, False, time.perf_counter() - start, message)
    return ToolResult(name, output, True, time.perf_counter() - start)
