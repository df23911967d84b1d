"""The harness: what one native run shares — clock regime, dispatcher, ledger, op numbering.

The task runner finds its harness by key (runners are pickled and duplicated per flow run, a
harness is not), operations reach it through `current_harness()` while they run, and the CLI
builds one per `maserve run`. `call_model` is the one path from an op to an engine: it hands the
request to the dispatcher at the next quiescent instant (deterministic order) and blocks the op's
thread on the lockstep gate until the outcome arrives.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from maserve_prefect.dispatch.dispatcher import Dispatcher
from maserve_prefect.dispatch.snapshot import Unit
from maserve_prefect.errors import ConfigError, TraceValidationError
from maserve_prefect.protocol.controls import Control
from maserve_prefect.protocol.outcomes import Outcome, OutcomeStatus
from maserve_prefect.protocol.requests import Request
from maserve_prefect.spec.binding import ContentDraws
from maserve_prefect.taskrunner.lockstep import Gate
from maserve_prefect.taskrunner.memory_store import StateStore
from maserve_prefect.taskrunner.oprun import OpCounter, OpRun, Scope
from maserve_prefect.trace.cas import BlobStore, MemoryStore
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import (
    Manifest,
    OpRecord,
    OpStatus,
    OpTimes,
    RootRecord,
    SessionRecord,
    StageRecord,
)


@dataclass(slots=True)
class RunBook:
    """In-memory copy of what the harness recorded (the ledger holds the durable one)."""

    roots: dict[str, RootRecord] = field(default_factory=dict)
    stages: dict[str, StageRecord] = field(default_factory=dict)
    sessions: dict[str, SessionRecord] = field(default_factory=dict)
    ops: list[OpRecord] = field(default_factory=list)
    task_runs: dict[str, str] = field(default_factory=dict)


class Harness:
    """Shared state of one native run.

    Args:
        gate: the clock regime (`VirtualGate` on the simulator, a wall gate on real engines).
        engine_kind: "sim" or the real engine's kind ("openai").
        content_source: on a real engine, "binding" draws output lengths (locked) and template
            decisions from the content model; "engine" lets the model generate freely and parses
            decisions from its text. The simulator always draws.
        dispatcher: routes model calls to replicas; None when the run has no engine.
        manifest: the trace manifest (its `trace_id` names the run in the ledger).
        ledger: durable store of records; None keeps records in memory only.
        store: blob store for payloads (defaults to the ledger's CAS, else memory).
    """

    def __init__(
        self,
        gate: Gate,
        manifest: Manifest,
        *,
        dispatcher: Dispatcher | None = None,
        ledger: Ledger | None = None,
        store: BlobStore | None = None,
        content: ContentDraws | None = None,
        engine_kind: str = "sim",
        content_source: str = "binding",
        output_budgets: Mapping[str, int] | None = None,
    ) -> None:
        self.gate = gate
        self.manifest = manifest
        self.dispatcher = dispatcher
        self.ledger = ledger
        self.store: BlobStore = store or (ledger.cas if ledger is not None else MemoryStore())
        self.content = content
        self.engine_kind = engine_kind
        if content_source not in ("binding", "engine"):
            raise ConfigError(
                f"content_source={content_source!r}: expected 'binding' (lengths and decisions "
                "drawn from the binding's seeded content model) or 'engine' (free generation)"
            )
        self.content_source = "binding" if engine_kind == "sim" else content_source
        self._budgets = dict(output_budgets or {})
        self.state = StateStore()
        self.counter = OpCounter()
        self.book = RunBook()
        self._lock = threading.Lock()
        self._recorded: set[str] = set()
        self._recorded_cv = threading.Condition()
        self._num_waiting = 0  # finishers waiting in `_recorded_cv` for a predecessor
        # Per-op bookkeeping kept cheap (the runner calls these for every op): a scope's qualified
        # form is computed once, and a scope already recorded is recognized without the lock.
        self._qualified: dict[Scope, Scope] = {}
        self._seen_scopes: set[Scope] = set()
        self.key = f"h{next(_KEYS)}"
        self._cancelled = threading.Event()
        self.flow_run_ids: list[str] = []  # the run's root flow runs, in start order
        self.parent_flow_run_id: str | None = None  # the run's own flow run, their parent
        if ledger is not None:
            ledger.begin_run(manifest)

    @property
    def draws_content(self) -> bool:
        """Whether output lengths and template decisions come from the binding's content model.

        Always on the simulator (it generates no text); on a real engine only when the run asked
        for `content_source="binding"` — then lengths are locked to the drawn values (the work
        is reproducible) while the text still comes from the model.
        """
        return self.content is not None and self.content_source == "binding"

    @property
    def trace_id(self) -> str:
        return self.manifest.trace_id

    # -- cancellation ----------------------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        """Whether the run was cancelled: the task runner starts no further op (each is
        recorded skipped) and an op that fails from now on is recorded incomplete."""
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Cancel the run (idempotent); in-flight engine calls end when the engine closes."""
        self._cancelled.set()

    def add_flow_run(self, flow_run_id: str) -> None:
        """Note a root flow run of this run (so a cancelled run can cancel it in Prefect)."""
        with self._lock:
            self.flow_run_ids.append(flow_run_id)

    # -- hierarchy -------------------------------------------------------------------------

    @staticmethod
    def qualify(s: Scope) -> Scope:
        """The scope with trace-unique ids: stage `root/stage`, session `root/session`.

        Flows name stage instances and sessions relative to their root ("generate",
        "refine#1", "refine.critic"); records need ids unique in the whole trace.
        """
        root = s.root_id
        stage = s.stage_id or "main"
        q_stage = stage if stage.startswith(root + "/") else f"{root}/{stage}"
        session = s.session_id
        q_session = (
            session if not session or session.startswith(root + "/") else f"{root}/{session}"
        )
        return replace(s, stage_id=q_stage, session_id=q_session)

    def qualified(self, s: Scope) -> Scope:
        """`qualify(s)`, memoized per scope (scopes are frozen and few; ops are many)."""
        q = self._qualified.get(s)
        if q is None:
            q = self._qualified[s] = self.qualify(s)
        return q

    def see_scope(self, s: Scope) -> None:
        """Record the root / stage / session of a scope the first time it is seen.

        A root seen for the first time has arrived: its record's `arrival_s` is the clock's now,
        and the dispatcher gets its arrival event (once per root) at that instant, before any
        event of the root's ops — deferred actions of one instant run in key order, and a root
        id sorts before the ids of its ops, which all start with it (`qualify`).
        """
        if s in self._seen_scopes:  # a set lookup is atomic; the set only grows
            return
        q = self.qualified(s)
        arrived: float | None = None
        with self._lock:
            if q.root_id not in self.book.roots:
                arrived = self.gate.now()
                root = RootRecord(root_id=q.root_id, workflow=q.workflow, arrival_s=arrived)
                self.book.roots[q.root_id] = root
                if self.ledger is not None:
                    self.ledger.add_root(self.trace_id, root)
            if q.stage_id not in self.book.stages:
                stage = StageRecord(
                    stage_id=q.stage_id,
                    root_id=q.root_id,
                    name=q.stage_name or s.stage_id or "main",
                    template=q.template,
                    iteration=q.iteration,
                )
                self.book.stages[q.stage_id] = stage
                if self.ledger is not None:
                    self.ledger.add_stage(self.trace_id, stage)
            if q.session_id and q.session_id not in self.book.sessions:
                session = SessionRecord(
                    session_id=q.session_id, root_id=q.root_id, stage_id=q.stage_id, role=q.role
                )
                self.book.sessions[q.session_id] = session
                if self.ledger is not None:
                    self.ledger.add_session(self.trace_id, session)
            self._seen_scopes.add(s)
        dispatcher = self.dispatcher
        if arrived is not None and dispatcher is not None:
            root_id = q.root_id
            self.gate.defer((arrived, root_id), lambda: dispatcher.on_arrival(root_id))

    def new_op_id(self, s: Scope) -> str:
        """`{session or stage}/n` over the qualified ids, n counting that session's ops.

        A session's ops are submitted by one thread in program order, so n — and the id — is
        reproducible even when branches of one root submit from several threads.
        """
        q = self.qualified(s)
        prefix = q.session_id or q.stage_id
        return f"{prefix}/{self.counter.next(prefix)}"

    def mark_final(self, root_id: str, op_id: str) -> None:
        """Record that `op_id` produced root `root_id`'s final artifact (its answer).

        The root's latency then ends at that op's completion, not at a straggler's (k-of-n
        joins leave ops running after the answer exists). Updates the run book and, when there
        is a ledger, the stored root record (`Ledger.set_root_final`).

        Raises:
            TraceValidationError: the root has no record here, or `op_id` is not a recorded op
                of that root (an op is recorded when it finishes; mark it after its result).
        """
        with self._lock:
            root = self.book.roots.get(root_id)
            if root is None:
                raise TraceValidationError(
                    f"mark_final({root_id!r}, {op_id!r}): root {root_id!r} has no record in run "
                    f"{self.trace_id!r}; mark the final op from inside the root's flow"
                )
            owners = {op.root_id for op in self.book.ops if op.op_id == op_id}
            if owners != {root_id}:
                found = f"belongs to root {sorted(owners)[0]!r}" if owners else "is not recorded"
                raise TraceValidationError(
                    f"mark_final({root_id!r}, {op_id!r}): op {op_id!r} {found} in run "
                    f"{self.trace_id!r}; name an op of this root after it has finished"
                )
            if self.ledger is not None:
                self.ledger.set_root_final(self.trace_id, root_id, op_id)
            self.book.roots[root_id] = root.model_copy(update={"final_op_id": op_id})

    # -- ops -------------------------------------------------------------------------------

    def finish(self, op: OpRun, *, flow_run_id: str | None, task_run_id: str) -> OpRecord:
        """Freeze a finished op, append it to the ledger (durable on return) and the book.

        A tool op's measured wall time goes to the ledger beside its record
        (`Ledger.tool_wall_times`), never into the record or the book.

        An op's predecessors are appended first: a state read can finish in the same quiescent
        instant as the write it read, on another thread, so this waits (briefly, in wall time)
        for every dep to be recorded — the ledger refuses dangling deps.
        """
        q = self.qualified(op.scope)
        # Built and validated once, with the qualified ids and its final attempt number.
        record = op.to_record(
            stage_id=q.stage_id, session_id=q.session_id, attempt=len(op.failed_attempts) + 1
        )
        deps = {d.op_id for d in record.deps}
        # `<=` on two sets is one atomic step under the GIL, and `_recorded` only grows: when it
        # holds already (nearly always: a successor is released after its predecessors finish),
        # nobody needs to wait or be woken.
        if not deps <= self._recorded:
            with self._recorded_cv:
                self._num_waiting += 1
                try:
                    ok = self._recorded_cv.wait_for(lambda: deps <= self._recorded, timeout=60)
                finally:
                    self._num_waiting -= 1
            if not ok:
                missing = sorted(deps - self._recorded)
                raise ConfigError(
                    f"op {record.op_id}: predecessors {missing} were never recorded; "
                    "they must finish before it"
                )
        records = [
            record.model_copy(
                update={
                    "attempt": i,
                    "status": OpStatus.FAILED,
                    "error": error,
                    "output_ref": None,
                    "output_token_ids_ref": None,
                    "num_output_tokens": 0,
                    "num_cached_tokens": 0,
                    "times": OpTimes(
                        ready_s=record.times.ready_s, submitted_s=start_s, completed_s=end_s
                    ),
                }
            )
            for i, (start_s, end_s, error) in enumerate(op.failed_attempts, 1)
        ]
        records.append(record)
        for rec in records:
            if self.ledger is not None:
                self.ledger.append_op(
                    self.trace_id,
                    rec,
                    prefect=(flow_run_id, task_run_id),
                    # Beside the record, not in it: the record's durations are on the run's clock.
                    tool_wall_s=op.tool_wall_s if rec is record else None,
                )
            with self._lock:
                self.book.ops.append(rec)
                self.book.task_runs[rec.op_id] = task_run_id
        with self._recorded_cv:
            self._recorded.add(record.op_id)
            if self._num_waiting:
                self._recorded_cv.notify_all()
        return record

    def output_budget(self, deployment: str, max_tokens: int | None) -> int | None:
        """A call's output limit: its own `max_tokens` and `deployment`'s budget (the pool file's
        `max_tokens`), whichever is smaller; None when neither is set."""
        budget = self._budgets.get(deployment)
        if budget is None or (max_tokens is not None and max_tokens <= budget):
            return max_tokens
        return budget

    def context_limit(self, deployment: str) -> int | None:
        """The max model length `deployment`'s replicas serve (the smallest), None when unknown
        (no dispatcher, no replica yet, or replicas that do not say)."""
        return self.dispatcher.max_model_len(deployment) if self.dispatcher is not None else None

    def call_model(
        self, op: OpRun, request: Request, controls: tuple[Control, ...] = ()
    ) -> Outcome:
        """Run one model call for `op` and block until its outcome (see the module docstring)."""
        dispatcher = self.dispatcher
        if dispatcher is None:
            raise ConfigError(
                f"op {op.op_id}: this run has no engine; start it with `maserve run` or build a "
                "Harness with a dispatcher"
            )
        box: list[Outcome] = []
        gate = self.gate
        unit = Unit(
            unit_id=op.op_id,
            root_id=op.scope.root_id,
            deployment=request.deployment,
            num_prompt_tokens=request.num_prompt(),
            max_tokens=request.max_tokens,
            priority=request.priority,
            ready_s=gate.now(),
            workflow=op.scope.workflow,
        )

        def submitted(t: float, replica: str) -> None:
            op.submitted_s = t

        def register(wake: Callable[[], None]) -> None:
            def done(outcome: Outcome) -> None:
                box.append(outcome)
                wake()

            gate.defer(
                (unit.ready_s, op.op_id),
                lambda: dispatcher.on_ready(
                    unit, request, controls=controls, on_done=done, on_submitted=submitted
                ),
            )

        gate.block(register, what=f"model call {op.op_id}")
        outcome = box[0]
        op.first_scheduled_s = outcome.first_scheduled_s
        op.first_token_s = outcome.first_token_s
        op.num_input_tokens = outcome.num_prompt_tokens
        op.num_output_tokens = outcome.num_output_tokens
        op.num_cached_tokens = outcome.num_cached_tokens
        # Every engine attempt but the last is kept as a failed attempt of this op.
        op.failed_attempts = [
            (a.start_s, a.end_s, a.error or "failed") for a in outcome.attempts[:-1]
        ]
        if len(outcome.attempts) > 1:  # retried: the recorded (last) attempt went out last
            op.submitted_s = outcome.attempts[-1].start_s
        if outcome.status is not OutcomeStatus.COMPLETED:
            # Completed only when the engine's outcome completed, whatever the op does next.
            op.status = OpStatus.FAILED
            op.error = outcome.error or outcome.status.value
        return outcome


_KEYS = itertools.count()
_CURRENT: contextvars.ContextVar[Harness | None] = contextvars.ContextVar(
    "maserve_harness", default=None
)


def current_harness() -> Harness:
    """The harness of the op the calling thread runs (set by the task runner).

    Raises:
        ConfigError: outside an op run by `MAServeTaskRunner` under a harness.
    """
    h = _CURRENT.get() or active_harness()
    if h is None:
        raise ConfigError(
            "no maserve harness here: ops run under MAServeTaskRunner inside `maserve run` or "
            "`with activate(Harness(...))`"
        )
    return h


class bound:
    """Bind `h` as the current harness of the calling thread for the block.

    A small class rather than a generator context manager: the runner enters one per op.
    """

    __slots__ = ("_harness", "_token")

    def __init__(self, h: Harness) -> None:
        self._harness = h
        self._token: contextvars.Token[Harness | None] | None = None

    def __enter__(self) -> Harness:
        self._token = _CURRENT.set(self._harness)
        return self._harness

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None
        _CURRENT.reset(self._token)
        self._token = None


_HARNESSES: dict[str, Harness] = {}
_ACTIVE: list[str] = []
_REG_LOCK = threading.Lock()


def register_harness(h: Harness) -> str:
    """Make `h` findable by its key (runners carry only the key)."""
    with _REG_LOCK:
        _HARNESSES[h.key] = h
    return h.key


def get_harness(key: str) -> Harness:
    try:
        return _HARNESSES[key]
    except KeyError:
        raise ConfigError(
            f"no harness {key!r} in this process; a MAServeTaskRunner bound to a harness can only "
            "run in the process that created it"
        ) from None


@contextlib.contextmanager
def activate(h: Harness) -> Iterator[Harness]:
    """Make `h` the harness that unbound runners use for the duration of the block."""
    register_harness(h)
    with _REG_LOCK:
        _ACTIVE.append(h.key)
    try:
        yield h
    finally:
        with _REG_LOCK:
            _ACTIVE.remove(h.key)
            _HARNESSES.pop(h.key, None)


def active_harness() -> Harness | None:
    """The innermost activated harness, if any."""
    with _REG_LOCK:
        return _HARNESSES[_ACTIVE[-1]] if _ACTIVE else None
