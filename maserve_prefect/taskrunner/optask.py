"""How a function becomes a maserve op: the `op_task` decorator and the op kind the runner reads.

One idea: an op is a plain Prefect task carrying one marker — its `OpKind`, set on the function
by `op_task` — which `MAServeTaskRunner` reads at submission to record the op's kind (a Prefect
task without the marker is recorded as a transform). The ops themselves (`model_call`,
`tool_call`, ...) live in the user folder `tasks/` and use this decorator.

Examples:
    >>> @op_task(OpKind.TOOL)
    ... def probe() -> int:
    ...     return 1
    >>> op_kind_of(probe).value
    'tool'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect import Task, task
from prefect.cache_policies import NO_CACHE

from maserve_prefect.trace.model import OpKind

OP_KIND_ATTR = "__maserve_op_kind__"
"""The function attribute that carries an op's kind."""


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
