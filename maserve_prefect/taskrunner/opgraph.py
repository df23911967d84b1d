"""The runner's op graph: one node per submitted op, and the walks near-ready reporting makes.

One idea: for a model op, the maserve non-model ops in front of it (transforms, tools, state ops)
are predicted to take no time, so while they have not started they are looked through —
replaced by their own upstream — when the runner asks whether the model op is near-ready
(`effective_upstream`) and which model ops a start may make near-ready (`model_ops_ahead`); the
model ops it waits for are found through every non-model op between (`model_preds`). Nodes are
plain slotted objects, read and written under the runner's lock (`maserve_prefect.taskrunner.runner`).
"""

from __future__ import annotations

import uuid
from contextvars import Context
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from prefect.futures import PrefectFuture

from maserve_prefect.taskrunner.opfutures import MAServeFuture
from maserve_prefect.taskrunner.oprun import OpRun

__all__ = ["OpNode", "OpState", "effective_upstream", "model_ops_ahead", "model_preds"]


class OpState(IntEnum):
    """Where a submitted op is, in order (each step only ever moves forward).

    Examples:
        >>> OpState.STARTED.started, OpState.STARTED.done, OpState.RESOLVED.done
        (True, False, True)
    """

    PENDING = 0
    """Submitted; waiting for its upstream futures or a worker."""
    STARTED = 1
    """Its body runs (a model op: its call may be queued at the dispatcher)."""
    DONE = 2
    """Its body finished and its record was written."""
    RESOLVED = 3
    """Its future holds the final state; its waiters are released."""

    @property
    def started(self) -> bool:
        return self >= OpState.STARTED

    @property
    def running(self) -> bool:
        return self is OpState.STARTED

    @property
    def done(self) -> bool:
        return self >= OpState.DONE


@dataclass(slots=True, eq=False)
class OpNode:
    """The runner's view of one submitted op."""

    task_run_id: uuid.UUID
    op: OpRun
    task: Any
    parameters: dict[str, Any]
    wait_for: list[PrefectFuture[Any]] | None
    dependencies: dict[str, set[Any]] | None
    context: Context | None
    future: MAServeFuture
    flow_run_id: str | None
    remote: bool
    downstream: list[OpNode] = field(default_factory=list)
    upstream: list[OpNode] = field(default_factory=list)
    waiters: list[OpNode] | None = None  # downstream nodes to release when this one resolves
    num_pending: int = 0
    state: OpState = OpState.PENDING
    near_ready_sent: bool = False  # near-ready (or, for a model op, known) was reported
    model: bool = False  # a model op
    see_through: bool = False  # a maserve non-model op: model near-ready looks through it


def effective_upstream(node: OpNode) -> list[OpNode]:
    """A model op's upstream for near-ready: pending maserve non-model ops are looked through
    (replaced by their own upstream, recursively); anything started, done or opaque stays."""
    out: list[OpNode] = []
    seen: set[int] = set()
    stack = list(reversed(node.upstream))
    while stack:
        u = stack.pop()
        if id(u) in seen:
            continue
        seen.add(id(u))
        if u.see_through and not u.state.started:
            stack.extend(reversed(u.upstream))
        else:
            out.append(u)
    return out


def model_preds(node: OpNode) -> tuple[str, ...]:
    """The model ops `node` waits for, through any non-model ops between (sorted ids)."""
    found: set[str] = set()
    seen: set[int] = set()
    stack = list(node.upstream)
    while stack:
        u = stack.pop()
        if id(u) in seen:
            continue
        seen.add(id(u))
        if u.model:
            found.add(u.op.op_id)
        else:
            stack.extend(u.upstream)
    return tuple(sorted(found))


def model_ops_ahead(downstream: list[OpNode]) -> list[OpNode]:
    """Model ops reached from `downstream` through pending maserve non-model ops only (the
    direct downstream excluded): a start there may make them near-ready."""
    out: list[OpNode] = []
    seen: set[int] = set()
    stack = [d for d in downstream if d.see_through and not d.state.started]
    while stack:
        d = stack.pop()
        for n in d.downstream:
            if id(n) in seen:
                continue
            seen.add(id(n))
            if n.model:
                out.append(n)
            elif n.see_through and not n.state.started:
                stack.append(n)
    return out
