"""What every operation needs: its OpRun and harness (`op_task`, the decorator every op uses,
lives in the library: `maserve_prefect.taskrunner.optask`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from maserve_prefect.errors import ConfigError
from maserve_prefect.taskrunner.harness import Harness, current_harness
from maserve_prefect.taskrunner.oprun import OpRun, current_op
from maserve_prefect.taskrunner.optask import OP_KIND_ATTR, op_kind_of, op_task

F = TypeVar("F", bound=Callable[..., Any])


def this_op(name: str) -> tuple[OpRun, Harness]:
    """The running op and its harness; a clear error when an op is called directly."""
    op = current_op()
    if op is None:
        raise ConfigError(
            f"{name} ran outside MAServeTaskRunner: submit it with `{name}.submit(...)` or "
            "`.map(...)` inside a flow that uses MAServeTaskRunner (a direct call bypasses the "
            "runner and would not be recorded)"
        )
    return op, current_harness()


__all__ = ["OP_KIND_ATTR", "op_kind_of", "op_task", "this_op"]
