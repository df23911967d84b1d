"""`MAServeTaskRunner`: a Prefect task runner that sees the op graph and records every op.

What it does differently from Prefect's ThreadPoolTaskRunner:

- **Holds ops until ready.** `submit` returns a future at once; the op goes to a worker thread
  only when every upstream future (in its parameters or `wait_for`) is done, so no worker thread
  ever parks on a dependency. Flows submit a stage's ops eagerly with futures as parameters, so the
  runner sees the graph ahead of readiness.
- **Reports readiness.** Ready and near-ready ops (every predecessor done or running, at least one
  running) go to the harness's dispatcher, where prefetch, fusion and placement plug in.
- **Records the Semantic Trace.** Hierarchy comes from `scope(...)` at submission; typed deps from
  the futures in parameters (data) and `wait_for` (control), plus state deps ops add while running;
  ready / submitted / completed times come from the harness clock; each finished op is appended
  to the ledger synchronously, linked to its Prefect task run. Task runs are named by op id and
  tagged only with low-cardinality tags (template, op kind).
- **Virtual time in lockstep.** Under a `VirtualGate`, the flow thread and each running op are
  gate participants: a future's `wait`/`result` blocks through the gate, so virtual time advances
  only when everything started is finished or waiting on the clock.

The runner pickles as its settings plus a harness key, so it can be duplicated per flow run and
wrap other runners' processes; the harness itself stays in the process that built it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import uuid
from collections.abc import Callable, Iterable
from contextvars import Context, copy_context
from dataclasses import dataclass, field
from typing import Any, Self

from prefect.context import FlowRunContext
from prefect.futures import PrefectConcurrentFuture, PrefectFuture
from prefect.task_runners import TaskRunner
from prefect.utilities.collections import visit_collection

from maserve_prefect.errors import ConfigError
from maserve_prefect.runtime.harness import Harness, active_harness, bound, get_harness
from maserve_prefect.runtime.oprun import OpRun, current_scope, running
from maserve_prefect.runtime.plans import Unit
from maserve_prefect.tasks.ops_common import op_kind_of
from maserve_prefect.trace.model import EdgeKind, OpStatus

_participant = threading.local()


def _is_participant() -> bool:
    return bool(getattr(_participant, "on", False))


def mark_participant(on: bool) -> None:
    """Declare that the calling thread is (or no longer is) counted by the gate.

    A driver that admits a root's thread before starting it calls `mark_participant(True)` in
    that thread, so the runner does not count it twice.
    """
    _participant.on = on


class MAServeFuture(PrefectConcurrentFuture[Any]):
    """A Prefect future whose waits go through the lockstep gate."""

    def __init__(
        self,
        task_run_id: uuid.UUID,
        wrapped: concurrent.futures.Future[Any],
        runner: MAServeTaskRunner,
        op_id: str,
    ) -> None:
        super().__init__(task_run_id=task_run_id, wrapped_future=wrapped)
        self._runner = runner
        self.op_id = op_id

    def _gate_wait(self) -> None:
        fut = self._wrapped_future
        harness = self._runner._harness
        if fut.done() or harness is None or not _is_participant():
            return
        harness.gate.block(
            lambda wake: fut.add_done_callback(lambda _: wake()), what=f"future of {self.op_id}"
        )

    def wait(self, timeout: float | None = None) -> None:
        self._gate_wait()
        super().wait(timeout)

    def result(self, timeout: float | None = None, raise_on_failure: bool = True) -> Any:
        self._gate_wait()
        return super().result(timeout=timeout, raise_on_failure=raise_on_failure)


@dataclass(slots=True, eq=False)
class _Node:
    """The runner's view of one submitted op."""

    task_run_id: uuid.UUID
    op: OpRun
    task: Any
    parameters: dict[str, Any]
    wait_for: list[PrefectFuture[Any]] | None
    dependencies: dict[str, set[Any]] | None
    context: Context
    future: MAServeFuture
    downstream: list[_Node] = field(default_factory=list)
    upstream: list[_Node] = field(default_factory=list)
    num_pending: int = 0
    started: bool = False
    done: bool = False
    near_ready_sent: bool = False


class MAServeTaskRunner(TaskRunner[MAServeFuture]):
    """Prefect task runner for maserve ops (see the module docstring).

    Args:
        max_workers: worker threads that execute ready ops.
        harness: key of a registered harness; None uses the harness active when the runner
            starts (`maserve_prefect.runtime.harness.activate`).

    Examples:
        >>> from prefect import flow
        >>> @flow(task_runner=MAServeTaskRunner(max_workers=4))
        ... def my_flow(): ...
    """

    def __init__(self, max_workers: int = 8, harness: str | None = None) -> None:
        super().__init__()
        if max_workers < 1:
            raise ConfigError(f"MAServeTaskRunner(max_workers={max_workers}): need at least 1")
        self._max_workers = max_workers
        self._harness_key = harness
        self._harness: Harness | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._nodes: dict[uuid.UUID, _Node] = {}
        self._lock = threading.Lock()
        self._admitted_flow_thread = False

    # -- Prefect TaskRunner API ------------------------------------------------------------

    def duplicate(self) -> Self:
        return type(self)(max_workers=self._max_workers, harness=self._harness_key)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, MAServeTaskRunner)
            and other._max_workers == self._max_workers
            and other._harness_key == self._harness_key
        )

    def __hash__(self) -> int:
        return hash((self._max_workers, self._harness_key))

    def __getstate__(self) -> dict[str, Any]:
        return {"max_workers": self._max_workers, "harness": self._harness_key}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def __enter__(self) -> Self:
        super().__enter__()
        self._harness = get_harness(self._harness_key) if self._harness_key else active_harness()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self._max_workers, thread_name_prefix="maserve-op"
        )
        if self._harness is not None and not _is_participant():
            self._harness.gate.admit()
            mark_participant(True)
            self._admitted_flow_thread = True
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        try:
            self._wait_all()
        finally:
            if self._admitted_flow_thread and self._harness is not None:
                mark_participant(False)
                self._admitted_flow_thread = False
                self._harness.gate.leave()
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            super().__exit__(exc_type, exc_value, traceback)

    def _wait_all(self) -> None:
        """Every submitted op finishes before the flow run ends (a complete trace)."""
        with self._lock:
            pending = [n.future for n in self._nodes.values() if not n.done]
        for fut in pending:
            fut.wait()

    def submit(
        self,
        task: Any,
        parameters: dict[str, Any],
        wait_for: Iterable[PrefectFuture[Any]] | None = None,
        dependencies: dict[str, set[Any]] | None = None,
    ) -> MAServeFuture:
        if not self._started or self._executor is None:
            raise RuntimeError("Task runner is not started")
        harness = self._harness
        task_run_id = uuid.uuid4()
        s = current_scope()
        if harness is not None:
            harness.see_scope(s)
            op_id = harness.new_op_id(s)
        else:
            op_id = f"{s.root_id}/{s.stage_id}/{task.name}/{task_run_id.hex[:8]}"
        kind = op_kind_of(task)
        node = _Node(
            task_run_id=task_run_id,
            op=OpRun(op_id=op_id, scope=s, kind=kind, task_name=task.name),
            task=task.with_options(task_run_name=op_id),
            parameters=parameters,
            wait_for=list(wait_for) if wait_for else None,
            dependencies=dependencies,
            context=copy_context(),
            future=MAServeFuture(task_run_id, concurrent.futures.Future(), self, op_id),
        )

        upstream: list[tuple[PrefectFuture[Any], EdgeKind]] = []

        def collect(obj: Any) -> Any:
            if isinstance(obj, PrefectFuture):
                upstream.append((obj, EdgeKind.DATA))
            return obj

        visit_collection(parameters, visit_fn=collect, return_data=False)
        upstream.extend((f, EdgeKind.CONTROL) for f in (node.wait_for or ()))
        with self._lock:
            self._nodes[node.task_run_id] = node
            for fut, edge in upstream:
                up = self._nodes.get(getattr(fut, "task_run_id", uuid.UUID(int=0)))
                if up is not None:
                    node.op.add_dep(up.op.op_id, edge)
                    if up not in node.upstream:
                        node.upstream.append(up)
                        up.downstream.append(node)
            waiting = [f for f, _ in upstream if not _future_done(f)]
            node.num_pending = len(waiting) + 1  # +1 released below, after callbacks are hung
        for f in waiting:
            f.add_done_callback(self._upstream_callback(node))
        self._upstream_done(node)
        return node.future

    # -- internals -------------------------------------------------------------------------

    def _upstream_callback(self, node: _Node) -> Callable[[PrefectFuture[Any]], None]:
        def callback(_: PrefectFuture[Any]) -> None:
            self._upstream_done(node)

        return callback

    def _upstream_done(self, node: _Node) -> None:
        with self._lock:
            node.num_pending -= 1
            ready = node.num_pending == 0
        if ready:
            self._release(node)
        else:
            self._check_near_ready(node)

    def _check_near_ready(self, node: _Node) -> None:
        harness = self._harness
        if harness is None or harness.dispatcher is None or node.near_ready_sent:
            return
        with self._lock:
            ups = node.upstream
            if not ups or not all(u.started or u.done for u in ups):
                return
            if not any(u.started and not u.done for u in ups):
                return
            node.near_ready_sent = True
        unit = Unit(node.op.op_id, node.op.scope.root_id, "", 0, 0, workflow=node.op.scope.workflow)
        dispatcher = harness.dispatcher
        harness.gate.defer(
            (harness.gate.now(), node.op.op_id), lambda: dispatcher.on_near_ready(unit)
        )

    def _release(self, node: _Node) -> None:
        harness = self._harness
        if harness is not None:
            harness.gate.admit()  # counted before the giver (an upstream op or the flow) leaves
            node.op.ready_s = harness.gate.now()
        assert self._executor is not None
        self._executor.submit(node.context.run, self._run, node)

    def _run(self, node: _Node) -> None:
        from prefect.task_engine import run_task_sync

        harness = self._harness
        mark_participant(harness is not None)
        with self._lock:
            node.started = True
            downstream = list(node.downstream)
        for d in downstream:
            self._check_near_ready(d)
        state: Any = None
        try:
            with running(node.op), _bind(harness):
                state = run_task_sync(
                    task=node.task,
                    task_run_id=node.task_run_id,
                    parameters=node.parameters,
                    wait_for=node.wait_for,
                    return_type="state",
                    dependencies=node.dependencies,
                    context={"cancel_event": threading.Event()},
                )
            if harness is not None:
                node.op.completed_s = harness.gate.now()
                if state is not None and state.is_failed():
                    node.op.status = OpStatus.FAILED
                    node.op.error = node.op.error or str(state.message)
                ctx = FlowRunContext.get()
                flow_run_id = str(ctx.flow_run.id) if ctx and ctx.flow_run else None
                harness.finish(node.op, flow_run_id=flow_run_id, task_run_id=str(node.task_run_id))
        finally:
            with self._lock:
                node.done = True
            node.future.wrapped_future.set_result(state)  # releases downstream (admits) first
            if harness is not None:
                mark_participant(False)
                harness.gate.leave()


def _bind(harness: Harness | None) -> contextlib.AbstractContextManager[Any]:
    return bound(harness) if harness is not None else contextlib.nullcontext()


def _future_done(f: PrefectFuture[Any]) -> bool:
    wrapped = getattr(f, "wrapped_future", None)
    if isinstance(wrapped, concurrent.futures.Future):
        return wrapped.done()
    return f.state.is_final()
