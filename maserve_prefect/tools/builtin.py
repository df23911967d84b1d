"""The tools every installation registers: sandboxed tests, document search, a calculator.

| name           | does                                                         | output            |
|----------------|--------------------------------------------------------------|-------------------|
| `run_tests`    | `sandbox.run_python_tests(code, tests, timeout_s)`           | `SandboxRun` dict |
| `doc_search`   | `retrieval.retrieve(query, k)` over the frozen stdlib corpus | hits + digest     |
| `web_search`   | the same frozen retrieval under the name the example specs   | hits + digest     |
|                | use: runs never reach the network, so "search" is local      |                   |
| `calculator`   | arithmetic on numbers (+ - * / // % **, parentheses, a few   | int or float      |
|                | math functions), parsed with `ast`, never `eval`             |                   |

A sandbox timeout is a tool failure (`ok=False`, the partial run kept as output); failing tests
are a successful tool call whose output says `passed: false`.

Examples:
    >>> from maserve_prefect.tools import call_tool
    >>> call_tool("calculator", expression="1000 * (1 + 0.05) ** 2").output
    1102.5
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from maserve_prefect.tools.registry import ToolFailure, register_tool
from maserve_prefect.tools.retrieval import retrieve
from maserve_prefect.tools.sandbox import run_python_tests


@register_tool("run_tests")
def run_tests(code: str, tests: str, timeout_s: float = 10.0) -> dict[str, object]:
    """Run `code` against `tests` in the sandbox; a timeout raises `ToolFailure`."""
    run = run_python_tests(code, tests, timeout_s)
    if run.timed_out:
        raise ToolFailure(run.error, output=run.to_dict())
    return run.to_dict()


@register_tool("doc_search")
def doc_search(query: str, k: int = 5) -> dict[str, object]:
    """Top-`k` passages from the frozen stdlib documentation corpus."""
    return retrieve(query, k).to_dict()


@register_tool("web_search")
def web_search(query: str, k: int = 5) -> dict[str, object]:
    """Alias of `doc_search`: search stays on the frozen local corpus (no network)."""
    return retrieve(query, k).to_dict()


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_FUNCS: dict[str, Callable[..., float]] = {
    "sqrt": math.sqrt, "log": math.log, "exp": math.exp, "abs": abs, "round": round,
    "min": min, "max": max,
}  # fmt: skip
_MAX_EXPONENT = 10_000


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ToolFailure(f"calculator: exponent {right} too large (limit {_MAX_EXPONENT})")
        return _BINARY[type(node.op)](left, right)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCS
        and not node.keywords
    ):
        return _FUNCS[node.func.id](*(_eval(a) for a in node.args))
    raise ToolFailure(
        f"calculator: unsupported element {ast.dump(node)[:80]}; use numbers, + - * / // % **, "
        f"parentheses and {', '.join(sorted(_FUNCS))}"
    )


@register_tool("calculator")
def calculator(expression: str) -> int | float:
    """Evaluate an arithmetic expression safely (no names, attributes or calls beyond a few
    math functions)."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ToolFailure(f"calculator: cannot parse {expression!r}: {exc.msg}") from None
    try:
        result = _eval(tree.body)
    except ZeroDivisionError:
        raise ToolFailure(f"calculator: division by zero in {expression!r}") from None
    if not isinstance(result, int | float):
        raise ToolFailure(f"calculator: {expression!r} did not give a number")
    return result
