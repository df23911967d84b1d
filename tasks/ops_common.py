"""What every operation needs: its OpRun and harness, and the Prefect task options ops share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from prefect import Task, task
from prefect.cache_policies import NO_CACHE

from maserve_prefect.errors import ConfigError
from maserve_prefect.taskrunner.harness import Harness, current_harness
from maserve_prefect.taskrunner.oprun import OpRun, current_op
from maserve_prefect.trace.model import OpKind

F = TypeVar("F", bound=Callable[..., Any])

OP_KIND_ATTR = "__maserve_op_kind__"


def op_task(kind: OpKind) -> Callable[[Callable[..., Any]], Task[Any, Any]]:
    """Make a function a maserve op: a Prefect task with no result caching or persistence (the
    CAS holds payloads) and **no tags** — Prefect acquires a concurrency slot through the API for
    every tag of every task run (measured ~0.3 s per op here), so op identity lives in the task
    run name and the ledger instead. The op kind rides on the function for the runner to read.
    """

    def deco(fn: Callable[..., Any]) -> Task[Any, Any]:
        setattr(fn, OP_KIND_ATTR, kind)
        decorate = task(cache_policy=NO_CACHE, persist_result=False, log_prints=False)
        return decorate(fn)

    return deco


def op_kind_of(t: Any) -> OpKind:
    """The op kind of a submitted task (transform for plain Prefect tasks)."""
    kind = getattr(getattr(t, "fn", None), OP_KIND_ATTR, None)
    return kind if isinstance(kind, OpKind) else OpKind.TRANSFORM


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
