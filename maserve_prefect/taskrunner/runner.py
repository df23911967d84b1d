"""`MAServeTaskRunner`: a Prefect task runner that sees the op graph and records every op.

What it does differently from Prefect's ThreadPoolTaskRunner:

- **Holds ops until ready.** `submit` returns a future at once; the op goes to a worker thread
  only when every upstream future (in its parameters or `wait_for`) is done, so no worker thread
  ever parks on a dependency. Flows submit a stage's ops eagerly with futures as parameters, so the
  runner sees the graph ahead of readiness.
- **Reports readiness.** Ready and near-ready ops (every predecessor done or running, at least one
  running) go to the harness's dispatcher, where prefetch, fusion and placement plug in. A model
  op is reported with what the runner knows before it runs: its deployment (from its
  parameters), its output limit (`max_tokens`, else `protocol.requests.DEFAULT_MAX_TOKENS`; the real
  length is drawn or generated inside the op), 0 prompt tokens (built inside the op), its
  priority, and the model ops it waits for — through transforms, tools and state ops between
  them. For model ops near-ready looks through maserve non-model ops that have not started yet
  (they are predicted to take no time), so a writer behind a vote is near-ready while the
  voters run; a model op that was never near-ready is reported as known when it is released,
  just before its ready event. Pool plans (`pool.control`) build their window from these
  events; plain plans ignore the extra fields.
- **Records the Semantic Trace.** Hierarchy comes from `scope(...)` at submission; typed deps from
  the futures in parameters (data) and `wait_for` (control), plus state deps ops add while running;
  ready / submitted / completed times come from the harness clock (a non-model op is submitted
  when its body starts on a worker or goes to the inner runner, a model op when the dispatcher
  hands it to a replica); each finished op is appended to the ledger synchronously, linked to
  its Prefect task run. An op is recorded `completed` only when its task run completed and its
  engine outcome did; one Prefect never started (NotReady: a predecessor failed) is `skipped`,
  naming that predecessor, with no submission time. Once the harness is cancelled
  (`Harness.cancel`, Ctrl-C on `maserve run`) no further op starts (each is recorded `skipped`)
  and an op that fails from then on is recorded `incomplete`. Task runs are named by op id (on
  a shallow copy of the task: `Task.with_options` re-reads the function's source per call and
  was most of the runner's per-op cost) and carry no tags.
- **Virtual time in lockstep.** Under a `VirtualGate`, the flow thread and each running op are
  gate participants: a future's `wait`/`result` blocks through the gate, so virtual time advances
  only when everything started is finished or waiting on the clock.
- **Wraps another runner.** With `inner=` (e.g. prefect-dask's `DaskTaskRunner`), ready ops go to
  `inner.submit(...)` instead of the local threads, with upstream futures replaced by their final
  states (picklable, and Prefect still records the task-run inputs). The op is recorded here, in
  the main process, from a done-callback on the inner future — no thread parks on it. maserve ops
  (model, tool, state, ...) need this process's harness (dispatcher, CAS, clock), which a worker
  process lacks: on the simulator (virtual time) submitting one fails with a `ConfigError`; under a
  wall-clock harness (`WallGate`) they run on the local threads and only plain Prefect tasks go to
  the inner runner.

The runner pickles as its settings, a harness key and the inner runner, so it can be duplicated
per flow run and shipped to other processes; the harness itself stays in the process that built it.

The op graph and the walks near-ready reporting makes over it are in `taskrunner.opgraph`; what
Prefect sees of a submitted op (its task named by op id, its parameters quoted) in
`taskrunner.opsubmit`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import uuid
from collections.abc import Callable, Iterable
from contextvars import copy_context
from typing import Any, Self

from prefect._internal.uuid7 import uuid7
from prefect.context import FlowRunContext
from prefect.futures import PrefectFuture
from prefect.states import Cancelled, Failed
from prefect.task_runners import TaskRunner
from prefect.utilities.annotations import quote
from prefect.utilities.collections import visit_collection

from maserve_prefect.dispatch.snapshot import Unit
from maserve_prefect.errors import ConfigError
from maserve_prefect.protocol.requests import DEFAULT_MAX_TOKENS
from maserve_prefect.taskrunner.harness import Harness, active_harness, bound, get_harness
from maserve_prefect.taskrunner.lockstep import VirtualGate
from maserve_prefect.taskrunner.opfutures import (
    MAServeFuture,
    final_state_of,
    future_done,
    is_participant,
    mark_participant,
)
from maserve_prefect.taskrunner.opgraph import (
    OpNode,
    OpState,
    effective_upstream,
    model_ops_ahead,
    model_preds,
)
from maserve_prefect.taskrunner.oprun import OpRun, current_scope, running
from maserve_prefect.taskrunner.opsubmit import futures_in, named_task, scan_parameters
from maserve_prefect.taskrunner.optask import OP_KIND_ATTR, op_kind_of
from maserve_prefect.trace.model import EdgeKind, OpKind, OpStatus

__all__ = ["MAServeFuture", "MAServeTaskRunner", "mark_participant"]


class MAServeTaskRunner(TaskRunner[MAServeFuture]):
    """Prefect task runner for maserve ops (see the module docstring).

    Args:
        max_workers: worker threads that execute ready ops in this process.
        harness: key of a registered harness; None uses the harness active when the runner
            starts (`maserve_prefect.taskrunner.harness.activate`).
        inner: a task runner that executes ready ops instead of the local threads (e.g.
            `prefect_dask.DaskTaskRunner`); it is entered and exited with this runner.

    Examples:
        >>> from prefect import flow
        >>> @flow(task_runner=MAServeTaskRunner(max_workers=4))
        ... def my_flow(): ...

        Spreading plain tasks over a Dask process cluster:

        >>> from prefect_dask import DaskTaskRunner
        >>> runner = MAServeTaskRunner(inner=DaskTaskRunner(cluster_kwargs={"n_workers": 2}))
    """

    def __init__(
        self,
        max_workers: int = 8,
        harness: str | None = None,
        inner: TaskRunner[Any] | None = None,
    ) -> None:
        super().__init__()
        if max_workers < 1:
            raise ConfigError(f"MAServeTaskRunner(max_workers={max_workers}): need at least 1")
        if inner is not None and not isinstance(inner, TaskRunner):
            raise ConfigError(
                f"MAServeTaskRunner(inner={inner!r}): pass a Prefect TaskRunner instance "
                "(e.g. prefect_dask.DaskTaskRunner(...)), not a class or other object"
            )
        if isinstance(inner, MAServeTaskRunner):
            raise ConfigError("MAServeTaskRunner(inner=MAServeTaskRunner(...)): nest it once")
        self._max_workers = max_workers
        self._harness_key = harness
        self._inner = inner
        self._harness: Harness | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._nodes: list[OpNode] = []
        self._lock = threading.Lock()
        self._admitted_flow_thread = False
        self._flow_run: tuple[Any, str | None] = (None, None)  # (flow run id, its str) memo

    @property
    def inner(self) -> TaskRunner[Any] | None:
        """The wrapped task runner, if any."""
        return self._inner

    # -- Prefect TaskRunner API ------------------------------------------------------------

    def duplicate(self) -> Self:
        inner = self._inner.duplicate() if self._inner is not None else None
        return type(self)(max_workers=self._max_workers, harness=self._harness_key, inner=inner)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, MAServeTaskRunner)
            and other._max_workers == self._max_workers
            and other._harness_key == self._harness_key
            and other._inner == self._inner
        )

    def __hash__(self) -> int:
        # Inner runners define __eq__ without __hash__; their type stands in for them.
        return hash((self._max_workers, self._harness_key, type(self._inner).__qualname__))

    def __getstate__(self) -> dict[str, Any]:
        return {
            "max_workers": self._max_workers,
            "harness": self._harness_key,
            "inner": self._inner,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def __enter__(self) -> Self:
        super().__enter__()
        self._harness = get_harness(self._harness_key) if self._harness_key else active_harness()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self._max_workers, thread_name_prefix="maserve-op"
        )
        if self._inner is not None:
            try:
                self._inner.__enter__()
            except BaseException:
                self._executor.shutdown(wait=False)
                self._executor = None
                raise
        if self._harness is not None and not is_participant():
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
            try:
                if self._inner is not None:
                    self._inner.__exit__(exc_type, exc_value, traceback)
            finally:
                if self._executor is not None:
                    self._executor.shutdown(wait=True)
                    self._executor = None
                self._drop_graph()
                super().__exit__(exc_type, exc_value, traceback)

    def _drop_graph(self) -> None:
        """Forget this run's op graph and harness once every op finished: futures and nodes
        point at each other, and without this the graph (parameters, records) would wait for a
        full garbage-collector pass instead of being freed with the flow's futures. An op still
        running (the flow was interrupted) keeps everything it needs to record itself."""
        with self._lock:
            if not all(n.state.done for n in self._nodes):
                return
            nodes, self._nodes = self._nodes, []
            self._harness = None  # the run book is the harness's to keep, not this runner's
        for node in nodes:
            node.future._node = None
            node.upstream = []
            node.downstream = []

    def _wait_all(self) -> None:
        """Every submitted op finishes before the flow run ends (a complete trace)."""
        with self._lock:
            pending = [n.future for n in self._nodes if not n.state.done]
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
        s = current_scope()
        remote = self._inner is not None and self._check_remote(task, harness)
        task_run_id = uuid7()  # as Prefect's own runners (no syscall on the flow thread)
        if harness is not None:
            harness.see_scope(s)
            op_id = harness.new_op_id(s)
        else:
            op_id = f"{s.root_id}/{s.stage_id}/{task.name}/{task_run_id.hex[:8]}"
        marker = getattr(getattr(task, "fn", None), OP_KIND_ATTR, None)
        kind = marker if isinstance(marker, OpKind) else OpKind.TRANSFORM  # as `op_kind_of`
        if remote:
            params, found = parameters, futures_in(parameters)
        else:
            params, found = scan_parameters(parameters)
        node = OpNode(
            task_run_id=task_run_id,
            op=OpRun(op_id=op_id, scope=s, kind=kind, task_name=task.name),
            task=named_task(task, op_id),
            parameters=params,
            wait_for=list(wait_for) if wait_for else None,
            dependencies=dependencies,
            context=copy_context(),
            future=MAServeFuture(task_run_id, concurrent.futures.Future(), self, op_id),
            flow_run_id=self._flow_run_id(),
            remote=remote,
            model=kind is OpKind.MODEL,
            see_through=kind is not OpKind.MODEL and marker is not None,
        )
        node.future._node = node

        upstream: list[tuple[PrefectFuture[Any], EdgeKind]] = [(f, EdgeKind.DATA) for f in found]
        upstream.extend((f, EdgeKind.CONTROL) for f in (node.wait_for or ()))
        # An upstream op of this runner releases the node itself when it resolves (`_complete`);
        # only other futures get a done-callback (each callback Prefect hangs on a future lives
        # as long as the future does).
        foreign: list[PrefectFuture[Any]] = []
        with self._lock:
            self._nodes.append(node)
            num_waiting = 0
            for fut, edge in upstream:
                up = fut._node if isinstance(fut, MAServeFuture) and fut._runner is self else None
                if up is None:
                    if not future_done(fut):
                        foreign.append(fut)
                    continue
                node.op.add_dep(up.op.op_id, edge)
                if up not in node.upstream:
                    node.upstream.append(up)
                    up.downstream.append(node)
                    if up.state is not OpState.RESOLVED:
                        if up.waiters is None:
                            up.waiters = []
                        up.waiters.append(node)
                        num_waiting += 1
            # +1 released below, after callbacks are hung
            node.num_pending = num_waiting + len(foreign) + 1
        for f in foreign:
            f.add_done_callback(self._upstream_callback(node))
        self._upstream_done(node)
        return node.future

    def _flow_run_id(self) -> str | None:
        """The id of the flow run submitting (as text, formatted once per flow run)."""
        ctx = FlowRunContext.get()
        run = ctx.flow_run if ctx is not None else None
        if run is None:
            return None
        uid, text = self._flow_run
        if uid != run.id:
            uid, text = self._flow_run = (run.id, str(run.id))
        return text

    def _check_remote(self, task: Any, harness: Harness | None) -> bool:
        """Whether `task` goes to the inner runner; a clear error for ops that cannot."""
        if getattr(getattr(task, "fn", None), OP_KIND_ATTR, None) is None:
            return True  # a plain Prefect task runs anywhere
        if harness is not None and not isinstance(harness.gate, VirtualGate):
            return False  # wall clock: maserve ops run here, next to the harness
        where = "on the simulator (virtual time)" if harness is not None else "without a harness"
        raise ConfigError(
            f"{task.name!r} in scope {current_scope().root_id}/{current_scope().stage_id} is a "
            f"maserve {op_kind_of(task).value} op and cannot run on the inner task runner "
            f"{type(self._inner).__name__} {where}: it needs this process's harness (engine "
            "dispatcher, CAS, clock), which a worker process does not have. Drop `inner=` for "
            "simulator runs, or run under a wall-clock harness (WallGate), where maserve ops run "
            "in this process and only plain Prefect tasks go to the inner runner."
        )

    # -- internals -------------------------------------------------------------------------

    def _upstream_callback(self, node: OpNode) -> Callable[[PrefectFuture[Any]], None]:
        def callback(_: PrefectFuture[Any]) -> None:
            self._upstream_done(node)

        return callback

    def _upstream_done(self, node: OpNode) -> None:
        with self._lock:
            node.num_pending -= 1
            ready = node.num_pending == 0
        if ready:
            self._release(node)
        else:
            self._check_near_ready(node)

    def _check_near_ready(self, node: OpNode) -> None:
        harness = self._harness
        if harness is None or harness.dispatcher is None or node.near_ready_sent:
            return
        with self._lock:
            ups = effective_upstream(node) if node.model else node.upstream
            if not ups or not all(u.state.started for u in ups):
                return
            if not any(u.state.running for u in ups):
                return
            node.near_ready_sent = True
            preds = model_preds(node) if node.model else ()
        unit = self._unit_of(node)
        dispatcher = harness.dispatcher
        harness.gate.defer(
            (harness.gate.now(), node.op.op_id), lambda: dispatcher.on_near_ready(unit, preds)
        )

    def _report_known(self, node: OpNode) -> None:
        """A model op released without a near-ready report: tell the dispatcher it exists (and
        what it waits for) before its ready event, which comes from inside the op."""
        harness = self._harness
        if harness is None or harness.dispatcher is None:
            return
        with self._lock:
            if node.near_ready_sent:
                return
            node.near_ready_sent = True
            preds = model_preds(node)
        unit = self._unit_of(node)
        dispatcher = harness.dispatcher
        harness.gate.defer(
            (harness.gate.now(), node.op.op_id), lambda: dispatcher.on_known(unit, preds)
        )

    def _unit_of(self, node: OpNode) -> Unit:
        """What the dispatcher can know of an op before it runs (module docstring)."""
        s = node.op.scope
        if not node.model:
            return Unit(node.op.op_id, s.root_id, "", 0, 0, workflow=s.workflow)
        limit = _param(node, "max_tokens")
        priority = _param(node, "priority")
        return Unit(
            node.op.op_id,
            s.root_id,
            str(_param(node, "deployment") or ""),
            0,
            limit if isinstance(limit, int) else DEFAULT_MAX_TOKENS,
            priority if isinstance(priority, int) else 0,
            workflow=s.workflow,
        )

    def _release(self, node: OpNode) -> None:
        harness = self._harness
        if harness is not None and harness.cancelled:
            harness.gate.admit()  # `_complete` leaves the gate for it
            msg = f"op {node.op.op_id}: not started, the run was cancelled"
            self._complete(node, Cancelled(message=msg), node.task_run_id)
            return
        if harness is not None:
            harness.gate.admit()  # counted before the giver (an upstream op or the flow) leaves
            node.op.ready_s = harness.gate.now()
            if node.model and not node.near_ready_sent:
                self._report_known(node)
        assert node.context is not None
        if node.remote:
            node.context.run(self._submit_inner, node)
            return
        assert self._executor is not None
        try:
            self._executor.submit(node.context.run, self._run, node)
        except Exception as exc:  # e.g. the executor was shut down under it
            msg = f"op {node.op.op_id}: could not be started on a worker thread: {exc}"
            self._complete(node, Failed(message=msg), node.task_run_id)

    def _mark_started(self, node: OpNode) -> None:
        harness = self._harness
        if harness is not None and not node.model:
            # A non-model op is submitted when its body starts; a model op when the dispatcher
            # hands it to a replica (`Harness.call_model`).
            node.op.submitted_s = harness.gate.now()
        if harness is None or harness.dispatcher is None:
            node.state = (
                OpState.STARTED
            )  # only near-ready reporting reads it, and it needs a dispatcher
            return
        with self._lock:
            node.state = OpState.STARTED
            downstream = list(node.downstream)
            ahead = model_ops_ahead(downstream)
        for d in downstream:
            self._check_near_ready(d)
        for d in ahead:
            self._check_near_ready(d)

    def _run(self, node: OpNode) -> None:
        from prefect.task_engine import run_task_sync

        harness = self._harness
        mark_participant(harness is not None)
        state: Any = None
        try:
            if harness is not None and harness.cancelled:  # queued before the run was cancelled
                state = Cancelled(message=f"op {node.op.op_id}: not started, the run was cancelled")
                return
            self._mark_started(node)
            with running(node.op), bound(harness) if harness is not None else _NO_HARNESS:
                state = run_task_sync(
                    task=node.task,
                    task_run_id=node.task_run_id,
                    parameters=node.parameters,
                    wait_for=node.wait_for,
                    return_type="state",
                    dependencies=node.dependencies,
                    context={"cancel_event": threading.Event()},
                )
        finally:
            mark_participant(False)
            self._complete(node, state, node.task_run_id)

    def _submit_inner(self, node: OpNode) -> None:
        """Hand a ready op to the inner runner; `_inner_done` records it when it finishes."""
        assert self._inner is not None
        self._mark_started(node)
        try:
            parameters = visit_collection(node.parameters, final_state_of, return_data=True)
            wait_for = [final_state_of(f) for f in node.wait_for] if node.wait_for else None
            inner = self._inner.submit(node.task, parameters, wait_for, node.dependencies)
        except Exception as exc:
            msg = f"op {node.op.op_id}: the inner runner {type(self._inner).__name__} refused it"
            self._complete(node, Failed(message=f"{msg}: {exc}"), node.task_run_id)
            return
        # The inner runner names its own task run; make our future point at the real one.
        node.future._task_run_id = inner.task_run_id
        inner.add_done_callback(lambda f: self._complete(node, final_state_of(f), f.task_run_id))

    def _complete(self, node: OpNode, state: Any, task_run_id: uuid.UUID) -> None:
        """Record a finished op, resolve its future (releasing downstream) and uncount it."""
        harness = self._harness
        try:
            if harness is not None:
                node.op.completed_s = harness.gate.now()
                _settle_status(node, state, cancelled=harness.cancelled)
                try:
                    harness.finish(
                        node.op, flow_run_id=node.flow_run_id, task_run_id=str(task_run_id)
                    )
                except Exception as exc:  # never lose a failed record silently
                    state = Failed(message=f"op {node.op.op_id} ran but was not recorded: {exc}")
        finally:
            with self._lock:
                node.state = OpState.DONE
                # What only running the op needed; the node stays for the graph's bookkeeping.
                node.parameters, node.context, node.task = _RELEASED, None, None
                node.wait_for = node.dependencies = None
            node.future.wrapped_future.set_result(state)
            with self._lock:
                node.state = OpState.RESOLVED
                waiters, node.waiters = node.waiters, None
            for d in waiters or ():
                self._upstream_done(d)  # released (admitted) before this op leaves the gate
            if harness is not None:
                harness.gate.leave()


def _settle_status(node: OpNode, state: Any, *, cancelled: bool) -> None:
    """The op's recorded status from its Prefect state: completed only when the task run
    completed (and nothing inside it, e.g. the engine's outcome, said otherwise); an op Prefect
    never started (NotReady: a predecessor did not complete) is skipped, naming that predecessor
    and without a submission time."""
    op = node.op
    if state is not None and state.is_completed():
        return  # `op.status` stays what the op set (FAILED when its engine outcome failed)
    if state is None or state.is_failed() or state.is_crashed():
        op.status = OpStatus.FAILED
        op.error = op.error or (str(state.message) if state else "no state")
        if cancelled:
            op.status = OpStatus.INCOMPLETE
            op.error = f"cancelled while running ({op.error})"
        return
    op.status = OpStatus.SKIPPED
    op.submitted_s = op.completed_s = None
    if cancelled and not state.is_pending():
        op.error = "never started: the run was cancelled"
        return
    upstream = [u.op for u in node.upstream if u.op.status is not OpStatus.COMPLETED]
    if upstream:
        first = upstream[0]
        op.error = (
            f"never started: upstream op {first.op_id} {first.status.value}"
            + (f" ({first.error})" if first.error else "")
            + f" [Prefect: {state.name}]"
        )
    elif cancelled:
        op.error = "never started: the run was cancelled"
    else:
        op.error = f"never started [Prefect: {state.name}: {state.message}]"


def _param(node: OpNode, name: str) -> Any:
    """A submitted parameter's value (unwrapping the runner's `quote`)."""
    value = node.parameters.get(name)
    return value.unquote() if isinstance(value, quote) else value


_NO_HARNESS = contextlib.nullcontext()
_RELEASED: dict[str, Any] = {}  # a finished node's parameters (never written to)
