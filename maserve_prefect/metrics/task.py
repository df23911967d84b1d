"""Task-level metrics of a trace: root latency, stage time and attempts.

The one idea: a root is measured from its *arrival* to the completion of its *terminal op* — the
op that produced its final artifact — because that is what the user waiting for the task
experiences, whatever the engine did per request.

Definitions (all times on the trace's clock, seconds):

- **final attempt**: an op id may appear several times (retries); the record with the highest
  `attempt` (the later record on ties) is the op's outcome. Earlier attempts still count as
  consumed work.
- **terminal op**: the root's `final_op_id` when the record names one and that op completed;
  otherwise the op that completed last (ties by op id, the larger wins). Workflows with k-of-n
  joins (`flows.concurrency.first_k`, a fork-join judge that proceeds after k workers) leave
  *straggler* ops that finish after the answer exists: they are work the root consumed, but
  they do not extend its latency.
- **answer ops**: the final op and its transitive predecessors within the root when
  `final_op_id` is set; every op of the root otherwise.
- **root status**: `failed` if any answer op's final attempt failed; otherwise `completed` when
  every answer op's final attempt completed with a `completed_s` time; otherwise `incomplete`
  (an op was cut off, or a root has no ops at all). A straggler that fails or is cut off after
  the answer exists does not change the status.
- **root latency** = terminal completion − arrival, defined for completed roots only.
- **stage time** = first ready time of the stage's ops (nested child stages included) → the last
  completion among them; `end_s` is None while any of those ops is not completed.
- **consumed work** of a root: op attempts, prefill tokens computed (input − cached) and output
  tokens, summed over *every* attempt of every op, so failed and cut-off work stays visible.

Examples:
    >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, OpTimes, RootRecord
    >>> t = Trace(manifest=Manifest(trace_id="t"), roots=[RootRecord(root_id="r", arrival_s=1.0)],
    ...           ops=[OpRecord(op_id="r/0", root_id="r", kind=OpKind.MODEL,
    ...                         times=OpTimes(ready_s=1.0, completed_s=3.5))])
    >>> root_latencies(t)[0].latency_s
    2.5
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from maserve_prefect.errors import TraceValidationError
from maserve_prefect.trace.model import OpRecord, OpStatus, RootRecord, Trace


class RootStatus(StrEnum):
    """Outcome of a whole root task."""

    COMPLETED = "completed"
    FAILED = "failed"
    INCOMPLETE = "incomplete"


DEFAULT_CLASS = "default"
"""The class of a root that names neither a workload class nor a workflow (e.g. imports)."""


def root_class(root: RootRecord) -> str:
    """The SLO class of a root: its `workload_class`, else its `workflow`, else `DEFAULT_CLASS`.

    The one definition of a root's class: deadlines, attainment, replay summaries and the
    per-class engine views all key on it.

    Examples:
        >>> root_class(RootRecord(root_id="r", workflow="debate"))
        'debate'
        >>> root_class(RootRecord(root_id="r"))
        'default'
    """
    return root.workload_class or root.workflow or DEFAULT_CLASS


def final_attempts(ops: Iterable[OpRecord]) -> dict[str, OpRecord]:
    """Map op id → its final attempt (highest `attempt`; the later record wins ties)."""
    out: dict[str, OpRecord] = {}
    for op in ops:
        prev = out.get(op.op_id)
        if prev is None or op.attempt >= prev.attempt:
            out[op.op_id] = op
    return out


@dataclass(frozen=True, slots=True)
class RootLatency:
    """One root's outcome and latency (`latency_s` is None unless completed)."""

    root_id: str
    workload_class: str
    arrival_s: float
    status: RootStatus
    terminal_op_id: str | None
    completed_s: float | None

    @property
    def latency_s(self) -> float | None:
        if self.completed_s is None:
            return None
        return self.completed_s - self.arrival_s


def _ops_by_root(trace: Trace) -> dict[str, list[OpRecord]]:
    by_root: dict[str, list[OpRecord]] = defaultdict(list)
    known = {r.root_id for r in trace.roots}
    for op in trace.ops:
        if op.root_id not in known:
            raise TraceValidationError(
                f"op {op.op_id!r} names root {op.root_id!r}, which has no root record; "
                "add the RootRecord (it carries the arrival time) or drop the op"
            )
        by_root[op.root_id].append(op)
    return by_root


def terminal_op(ops: Iterable[OpRecord], final_op_id: str | None = None) -> OpRecord | None:
    """The terminal op of one root's `ops` (see the module docstring); None if none completed.

    Args:
        ops: the root's ops (final attempts).
        final_op_id: the root's `final_op_id`; used when that op is among `ops` and completed,
            else the op that completed last is the terminal op.

    Examples:
        >>> from maserve_prefect.trace.model import OpKind, OpTimes
        >>> ops = [OpRecord(op_id=i, root_id="r", kind=OpKind.MODEL, times=OpTimes(completed_s=t))
        ...        for i, t in (("answer", 2.0), ("straggler", 5.0))]
        >>> terminal_op(ops).op_id, terminal_op(ops, "answer").op_id
        ('straggler', 'answer')
    """
    ops = list(ops)
    if final_op_id is not None:
        for op in ops:
            if (
                op.op_id == final_op_id
                and op.status is OpStatus.COMPLETED
                and op.times.completed_s is not None
            ):
                return op
    best: OpRecord | None = None
    for op in ops:
        t = op.times.completed_s
        if t is None or op.status is not OpStatus.COMPLETED:
            continue
        if best is None or (t, op.op_id) > (best.times.completed_s or 0.0, best.op_id):
            best = op
    return best


def answer_ops(root: RootRecord, finals: dict[str, OpRecord]) -> dict[str, OpRecord]:
    """The root's answer ops: its final op and that op's predecessors among `finals` (the
    root's final attempts), or all of `finals` when the root names no final op.

    Raises:
        TraceValidationError: the root names a final op that is not one of its ops.
    """
    final = root.final_op_id
    if final is None:
        return finals
    if final not in finals:
        raise TraceValidationError(
            f"root {root.root_id!r} names final op {final!r}, which is not an op of that root; "
            "fix the root record's final_op_id (or keep the op when filtering the trace)"
        )
    out: dict[str, OpRecord] = {}
    todo = [final]
    while todo:
        op_id = todo.pop()
        if op_id in out or op_id not in finals:
            continue  # a dep on another root's op is not part of this root's answer
        out[op_id] = finals[op_id]
        todo.extend(d.op_id for d in finals[op_id].deps)
    return out


def _status(finals: dict[str, OpRecord]) -> RootStatus:
    if not finals:
        return RootStatus.INCOMPLETE
    if any(op.status is OpStatus.FAILED for op in finals.values()):
        return RootStatus.FAILED
    done = all(
        op.status is OpStatus.COMPLETED and op.times.completed_s is not None
        for op in finals.values()
    )
    return RootStatus.COMPLETED if done else RootStatus.INCOMPLETE


def root_latencies(trace: Trace) -> list[RootLatency]:
    """One `RootLatency` per root record, in record order.

    Raises:
        TraceValidationError: an op names an unknown root, a root completes before it arrives,
            or a root names a final op that is not one of its ops.
    """
    by_root = _ops_by_root(trace)
    out = []
    for root in trace.roots:
        finals = final_attempts(by_root.get(root.root_id, ()))
        status = _status(answer_ops(root, finals)) if finals else RootStatus.INCOMPLETE
        term = (
            terminal_op(finals.values(), root.final_op_id)
            if status is RootStatus.COMPLETED
            else None
        )
        done_s = term.times.completed_s if term is not None else None
        if done_s is not None and done_s < root.arrival_s:
            raise TraceValidationError(
                f"root {root.root_id!r}: terminal op {term.op_id if term else ''!r} completes at "
                f"{done_s} s, before the root's arrival at {root.arrival_s} s; fix arrival_s"
            )
        out.append(
            RootLatency(
                root.root_id,
                root_class(root),
                root.arrival_s,
                status,
                term.op_id if term else None,
                done_s,
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class StageTime:
    """One stage instance: first op ready → last op completed (`end_s` None if unfinished)."""

    stage_id: str
    root_id: str
    name: str
    start_s: float | None
    end_s: float | None

    @property
    def duration_s(self) -> float | None:
        if self.start_s is None or self.end_s is None:
            return None
        return self.end_s - self.start_s


def stage_times(trace: Trace) -> list[StageTime]:
    """One `StageTime` per stage record, in record order; a stage includes its nested stages.

    Examples:
        >>> from maserve_prefect.trace.model import Manifest, StageRecord
        >>> stage_times(Trace(manifest=Manifest(trace_id="t"),
        ...                   stages=[StageRecord(stage_id="s", root_id="r", name="s")]))[0].end_s
    """
    children: dict[str, list[str]] = defaultdict(list)
    for s in trace.stages:
        if s.parent_stage_id is not None:
            children[s.parent_stage_id].append(s.stage_id)
    finals = final_attempts(trace.ops)
    by_stage: dict[str, list[OpRecord]] = defaultdict(list)
    for op in finals.values():
        by_stage[op.stage_id].append(op)
    out = []
    for s in trace.stages:
        ops: list[OpRecord] = []
        todo, seen = [s.stage_id], set()
        while todo:
            sid = todo.pop()
            if sid in seen:
                raise TraceValidationError(
                    f"stage {sid!r} is its own ancestor; fix parent_stage_id in the trace"
                )
            seen.add(sid)
            ops.extend(by_stage.get(sid, ()))
            todo.extend(children.get(sid, ()))
        readies = [op.times.ready_s for op in ops if op.times.ready_s is not None]
        done = [op.times.completed_s for op in ops]
        finished = bool(ops) and all(
            t is not None and op.status is OpStatus.COMPLETED
            for t, op in zip(done, ops, strict=True)
        )
        end = max(t for t in done if t is not None) if finished else None
        out.append(StageTime(s.stage_id, s.root_id, s.name, min(readies, default=None), end))
    return out


@dataclass(frozen=True, slots=True)
class AttemptSummary:
    """Roots of one status and the work they consumed (all attempts of all their ops)."""

    status: RootStatus
    num_roots: int
    num_op_attempts: int
    num_prefill_tokens: int
    num_output_tokens: int


def attempts(trace: Trace) -> dict[RootStatus, AttemptSummary]:
    """Completed / failed / incomplete roots and their consumed work (every status present).

    Examples:
        >>> from maserve_prefect.trace.model import Manifest
        >>> attempts(Trace(manifest=Manifest(trace_id="t")))[RootStatus.FAILED].num_roots
        0
    """
    by_root = _ops_by_root(trace)
    acc = {s: [0, 0, 0, 0] for s in RootStatus}
    for lat in root_latencies(trace):
        row = acc[lat.status]
        row[0] += 1
        for op in by_root.get(lat.root_id, ()):
            row[1] += 1
            row[2] += max(op.num_input_tokens - op.num_cached_tokens, 0)
            row[3] += op.num_output_tokens
    return {s: AttemptSummary(s, *v) for s, v in acc.items()}
