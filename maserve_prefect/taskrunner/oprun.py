"""Op identity and the in-progress record of one realized operation.

Flows say where they are with `scope(...)` (root, stage instance, session, role, iteration); the
task runner reads the scope when an op is submitted — in the submitting (flow) thread — and gives
the op a hierarchical, deterministic id `"{root}/{stage}/{session}/{n}"` (n counts the session's ops in submission
order; one thread submits a session's ops, so n is reproducible). While the op
runs, `current_op()` returns its `OpRun`, where operations (model_call, tool_call, ...) write what
they realized; the runner turns it into an immutable `OpRecord` when the op ends.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from maserve_prefect.trace.model import (
    Dep,
    EdgeKind,
    GenerationSettings,
    OpKind,
    OpRecord,
    OpStatus,
    OpTimes,
)


@dataclass(frozen=True, slots=True)
class Scope:
    """Where in the workload hierarchy the flow currently is."""

    root_id: str = "root"
    stage_id: str = "main"
    session_id: str = ""
    role: str = ""
    iteration: int = 0
    round: int = 0
    workflow: str = ""
    stage_name: str = ""
    template: str = ""


_DEFAULT_SCOPE = Scope()  # frozen, so sharing it as the default is safe
_SCOPE: contextvars.ContextVar[Scope] = contextvars.ContextVar("maserve_scope")
_CURRENT_OP: contextvars.ContextVar[OpRun | None] = contextvars.ContextVar(
    "maserve_current_op", default=None
)


def current_scope() -> Scope:
    """The scope of the calling code (the default scope outside any `scope()`)."""
    return _SCOPE.get(_DEFAULT_SCOPE)


@contextlib.contextmanager
def scope(**changes: object) -> Iterator[Scope]:
    """Refine the current scope for the ops submitted inside the block.

    Examples:
        >>> with scope(root_id="r1", stage_id="analysis"):
        ...     with scope(role="analyst", session_id="analyst-0"):
        ...         s = current_scope()
        >>> (s.root_id, s.stage_id, s.role)
        ('r1', 'analysis', 'analyst')
    """
    new = replace(current_scope(), **changes)  # type: ignore[arg-type]
    token = _SCOPE.set(new)
    try:
        yield new
    finally:
        _SCOPE.reset(token)


def current_op() -> OpRun | None:
    """The op being executed by the calling thread, if any."""
    return _CURRENT_OP.get()


class running:
    """Make `op` the current op for the block (the runner wraps each op's execution in it).

    A small class rather than a generator context manager: the runner enters one per op.

    Examples:
        >>> op = OpRun(op_id="r/main/0", scope=Scope(), kind=OpKind.TRANSFORM, task_name="t")
        >>> with running(op):
        ...     current_op() is op
        True
        >>> current_op() is None
        True
    """

    __slots__ = ("_op", "_token")

    def __init__(self, op: OpRun) -> None:
        self._op = op
        self._token: contextvars.Token[OpRun | None] | None = None

    def __enter__(self) -> OpRun:
        self._token = _CURRENT_OP.set(self._op)
        return self._op

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None
        _CURRENT_OP.reset(self._token)
        self._token = None


class OpCounter:
    """Op numbering per key (thread-safe; deterministic when one thread submits under a key)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: dict[str, int] = {}

    def next(self, key: str) -> int:
        with self._lock:
            n = self._next.get(key, 0)
            self._next[key] = n + 1
            return n


@dataclass(slots=True)
class OpRun:
    """A mutable record of one op in progress; `to_record()` freezes it."""

    op_id: str
    scope: Scope
    kind: OpKind
    task_name: str
    deps: list[Dep] = field(default_factory=list)
    input_refs: list[str] = field(default_factory=list)
    output_ref: str | None = None
    output_token_ids_ref: str | None = None
    generation: GenerationSettings | None = None
    num_input_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    tool_name: str | None = None
    tool_duration_s: float | None = None
    tool_wall_s: float | None = None
    """A tool's measured wall duration: stored in the ledger beside the record, not in it."""
    external_delay_s: float = 0.0
    ready_s: float | None = None
    submitted_s: float | None = None
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    completed_s: float | None = None
    attempt: int = 1
    status: OpStatus = OpStatus.COMPLETED
    error: str | None = None
    failed_attempts: list[tuple[float, float, str]] = field(default_factory=list)
    """Earlier engine attempts of this op that failed: (start_s, end_s, error)."""

    def add_dep(self, op_id: str, kind: EdgeKind, required: bool = True) -> None:
        """Add a predecessor discovered while running (e.g. the writer of a state version read)."""
        if op_id != self.op_id and all(d.op_id != op_id or d.kind != kind for d in self.deps):
            self.deps.append(Dep(op_id=op_id, kind=kind, required=required))

    def to_record(
        self,
        *,
        stage_id: str | None = None,
        session_id: str | None = None,
        attempt: int | None = None,
    ) -> OpRecord:
        """The frozen, validated record of this op.

        Args:
            stage_id / session_id: ids to record instead of the scope's (the harness passes the
                trace-unique qualified ids, so the record is built and validated once).
            attempt: attempt number to record instead of `self.attempt`.
        """
        s = self.scope
        return OpRecord(
            op_id=self.op_id,
            root_id=s.root_id,
            stage_id=s.stage_id if stage_id is None else stage_id,
            session_id=s.session_id if session_id is None else session_id,
            kind=self.kind,
            role=s.role,
            iteration=s.iteration,
            round=s.round,
            deps=tuple(self.deps),
            input_refs=tuple(self.input_refs),
            output_ref=self.output_ref,
            output_token_ids_ref=self.output_token_ids_ref,
            generation=self.generation,
            num_input_tokens=self.num_input_tokens,
            num_output_tokens=self.num_output_tokens,
            num_cached_tokens=self.num_cached_tokens,
            tool_name=self.tool_name,
            tool_duration_s=self.tool_duration_s,
            external_delay_s=self.external_delay_s,
            times=OpTimes(
                ready_s=self.ready_s,
                submitted_s=self.submitted_s,
                first_scheduled_s=self.first_scheduled_s,
                first_token_s=self.first_token_s,
                completed_s=self.completed_s,
            ),
            attempt=self.attempt if attempt is None else attempt,
            status=self.status,
            error=self.error,
        )
