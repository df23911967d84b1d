"""What Prefect sees of an op the runner submits: its task, named by op id, and its parameters,
quoted wherever they hold no future.

One idea: Prefect must record exactly the edges the ledger records — the futures in an op's
parameters — and name the task run after the op, and the flow thread pays for both on every
submit. So both are done by hand, at a fraction of what Prefect's generic helpers cost: a shallow
copy of the task instead of `Task.with_options` (which re-reads the function's source per call),
and one direct walk over the parameters instead of `visit_collection`.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from prefect.futures import PrefectFuture
from prefect.utilities.annotations import quote
from pydantic import BaseModel

__all__ = ["futures_in", "named_task", "scan_parameters"]

_ATOMS = frozenset({str, bytes, int, float, bool, type(None)})
_PLAIN_COPY: dict[type, bool] = {}


def named_task(task: Any, op_id: str) -> Any:
    """A shallow copy of `task` whose task runs are named `op_id`.

    Prefect formats `task_run_name` with the parameters, so braces are escaped. A plain copy of
    the instance dict when the class copies like a plain object (Prefect's `Task` does), which is
    what `copy.copy` would do by way of `__reduce_ex__`, at a fraction of its cost.
    """
    cls: Any = type(task)
    plain = _PLAIN_COPY.get(cls)
    if plain is None:
        plain = _PLAIN_COPY[cls] = (
            cls.__reduce_ex__ is object.__reduce_ex__
            and getattr(cls, "__getstate__", object.__getstate__) is object.__getstate__
            and not hasattr(cls, "__copy__")
            and not hasattr(cls, "__setstate__")
            and not any(c.__dict__.get("__slots__") for c in cls.__mro__)
            and isinstance(getattr(task, "__dict__", None), dict)
        )
    if plain:
        named = cls.__new__(cls)
        named.__dict__.update(task.__dict__)
    else:
        named = copy.copy(task)
    named.task_run_name = op_id.replace("{", "{{").replace("}", "}}")
    return named


def scan_parameters(parameters: dict[str, Any]) -> tuple[dict[str, Any], list[PrefectFuture[Any]]]:
    """One walk over submitted parameters: (parameters with every future-free value wrapped in
    `quote`, every future inside them in traversal order).

    Why quote: Prefect derives a task run's inputs from its parameters, and besides futures it
    links any value it has seen returned by a task, matched by object identity — interned
    strings and reused objects make false data edges. Quoting what holds no future makes Prefect
    record exactly the futures, the same edges the ledger records; Prefect unwraps quotes before
    the task runs, so the task sees its values unchanged. Futures are looked for where Prefect
    looks (lists, tuples, sets, dicts, dataclasses, pydantic models); values are rebuilt only
    through lists, tuples and dicts — a set, dataclass or model is passed as it is (a set that
    holds a future) or quoted whole.

    Examples:
        >>> from prefect.utilities.annotations import quote
        >>> params, futures = scan_parameters({"x": 1, "xs": [2, "a"]})
        >>> params == {"x": quote(1), "xs": quote([2, "a"])}, futures
        (True, [])
    """
    found: list[PrefectFuture[Any]] = []
    return {k: _scan(v, found)[0] for k, v in parameters.items()}, found


def _scan(value: Any, found: list[PrefectFuture[Any]]) -> tuple[Any, bool]:
    """`value` quoted where it holds no future, and whether it holds one (see above)."""
    if type(value) in _ATOMS:  # the common case first
        return quote(value), False
    if isinstance(value, PrefectFuture):
        found.append(value)
        return value, True
    if isinstance(value, list | tuple):
        parts = [_scan(v, found) for v in value]
        if any(holds for _, holds in parts):
            return type(value)(q for q, _ in parts), True
        return quote(value), False
    if isinstance(value, dict):
        items = {k: _scan(v, found) for k, v in value.items()}
        if any(holds for _, holds in items.values()):
            return {k: q for k, (q, _) in items.items()}, True
        return quote(value), False
    if isinstance(value, set | frozenset):
        holds = False
        for v in value:
            holds = _scan(v, found)[1] or holds
        return (value, True) if holds else (quote(value), False)
    found.extend(futures_in(value))  # dataclasses and models: their futures are edges
    return quote(value), False


def futures_in(value: Any) -> list[PrefectFuture[Any]]:
    """Every future inside `value`, in traversal order.

    The containers Prefect itself looks into — lists, tuples, sets, dicts, dataclasses and
    pydantic models — walked directly: Prefect's generic `visit_collection` cost about half of
    the flow thread's submit time, and the flow thread submits every op.
    """
    found: list[PrefectFuture[Any]] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, PrefectFuture):
            found.append(item)
        elif isinstance(item, str | bytes | int | float | bool | type(None)):
            continue
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend(reversed(list(item)))
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            stack.extend(reversed([getattr(item, f.name) for f in dataclasses.fields(item)]))
        elif isinstance(item, BaseModel):
            stack.extend(reversed([getattr(item, k) for k in type(item).model_fields]))
    return found
