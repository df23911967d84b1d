"""The base of every spec model, and the one place pydantic errors become `SpecError`.

Users of the spec see a single error type. Structural problems (a wrong type, a bound below 1)
are found by pydantic; semantic problems (an unknown stage, a cycle) are raised as `SpecError` by
validators. Either way, `SpecModel.__init__` and the loaders in `spec.io` convert pydantic's
`ValidationError` into one `SpecError` whose message names the element path (`stages[2]
('synthesis').control.width`), what was wrong and, for structural problems, the value given.
A `SpecError` raised inside a validator keeps its own message, prefixed by the element path.
Discriminated-union tags in a location are shown as the node's kind: `composition.steps[1]
(parallel).join`.

Examples:
    >>> from maserve_prefect.spec.rules import JoinRule
    >>> JoinRule(rule="k_of_n", k=0)
    Traceback (most recent call last):
    ...
    maserve_prefect.errors.SpecError: JoinRule: k: Input should be greater than or equal to 1 (got 0)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from maserve_prefect.errors import SpecError

LineOf = Callable[[tuple[int | str, ...]], int | None]
"""Maps a pydantic error location to a 1-based source line, when the source is known."""


# Pydantic calls a custom `__init__` for nested models too; only the outermost call converts, so
# the error keeps its full location. `spec.io` enters one level itself to convert with a file name.
_depth: ContextVar[int] = ContextVar("maserve_spec_validation_depth", default=0)


class SpecModel(BaseModel):
    """Frozen, strict base for spec models; construction errors surface as `SpecError`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def __init__(self, /, **data: Any) -> None:
        outermost = _depth.get() == 0
        token = _depth.set(_depth.get() + 1)
        try:
            super().__init__(**data)
        except ValidationError as exc:
            if outermost:
                raise spec_error_from(exc, source=type(self).__name__, data=data) from exc
            raise
        finally:
            _depth.reset(token)


@contextmanager
def raw_validation_errors() -> Iterator[None]:
    """Within this block, spec models raise pydantic's `ValidationError` (for the caller to
    convert with more context, e.g. a file name and line)."""
    token = _depth.set(_depth.get() + 1)
    try:
        yield
    finally:
        _depth.reset(token)


def format_loc(loc: Sequence[int | str], data: Any = None) -> str:
    """Render a pydantic location as an element path, naming list items by their `name`.

    Examples:
        >>> data = {"stages": [{"name": "s", "control": {"kind": "fork_join"}}]}
        >>> format_loc(("stages", 0, "control", "fork_join", "width"), data)
        "stages[0] ('s').control (fork_join).width"
    """
    out = ""
    node = data
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            node = node[part] if isinstance(node, list | tuple) and part < len(node) else None
            name = node.get("name") if isinstance(node, dict) else None
            if isinstance(name, str):
                out += f" ({name!r})"
            continue
        if isinstance(node, dict) and part not in node and node.get("kind") == part:
            # A discriminated-union tag: it names the node's kind, not a field.
            out += f" ({part})"
            continue
        out += f".{part}" if out else str(part)
        node = node.get(part) if isinstance(node, dict) else None
    return out


_NO_INPUT_ECHO = frozenset(
    {"missing", "union_tag_not_found", "model_type", "model_attributes_type"}
)


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def spec_error_from(
    exc: ValidationError, *, source: str, data: Any = None, line_of: LineOf | None = None
) -> SpecError:
    """Convert pydantic's first error into a `SpecError` naming `source` and the element path.

    Args:
        exc: the validation error pydantic raised.
        source: what was being read: a file path, or a model name for direct construction.
        data: the raw input, used to name list items by their `name` field.
        line_of: optional location → line lookup (YAML sources).

    Examples:
        >>> from maserve_prefect.spec.rules import JoinRule
        >>> data = {"rule": "all", "k": "x"}
        >>> try:
        ...     with raw_validation_errors():
        ...         JoinRule.model_validate(data)
        ... except ValidationError as e:
        ...     print(spec_error_from(e, source="spec.yaml", data=data))
        spec.yaml: k: Input should be a valid integer, unable to parse string as an integer (got 'x')
    """
    first = exc.errors(include_url=False)[0]
    loc: tuple[int | str, ...] = tuple(first["loc"])
    path = format_loc(loc, data)
    where = source
    line = line_of(loc) if line_of is not None and loc else None
    if line is not None:
        where += f", line {line}"
    cause = first.get("ctx", {}).get("error")
    if isinstance(cause, SpecError):
        message = str(cause)
    elif first["type"] in _NO_INPUT_ECHO or "input" not in first:
        message = first["msg"]
    else:
        message = f"{first['msg']} (got {_short_repr(first['input'])})"
    # Only the first problem: pydantic's later errors are often its consequences (an invalid
    # item dropped from a list makes the list "too short").
    return SpecError(f"{where}: {path}: {message}" if path else f"{where}: {message}")
