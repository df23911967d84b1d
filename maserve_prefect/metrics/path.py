"""Completion-path ledger: where a root's latency went, along its critical path.

The one idea: walk backwards from the terminal op (`metrics.task.terminal_op`: the op that produced
the root's final artifact, else the op that completed last), at each op to its *binding
predecessor* (the dependency that completed last, ties by the larger op id), until an op with no
binding predecessor. Each op on that path contributes four segments, the differences of
a chain of timestamps that starts at the root's arrival and ends at the terminal completion:

    anchor ─ boundary gap ─► ready ─ pre-submission ─► submitted ─ backend wait ─►
    first scheduled ─ scheduled residence ─► completed  (= next op's anchor)

where the anchor is the binding predecessor's completion (the root's arrival for the first op).
Because the segments telescope, they sum to root latency = terminal completion − arrival (up to
float rounding, < 1e-9 s).

Rules for imperfect timestamps (documented so every root reconciles):

- A missing timestamp takes the value of the one before it in the chain, so its segment is 0 and
  the time falls into the next segment (no `first_scheduled_s` → backend wait 0, the whole
  submitted → completed span is scheduled residence). Non-model ops (tools, transforms) record
  `submitted_s` as their start, so pre-submission is ready → start and, without a scheduled
  time, the run counts as scheduled residence.
- Every chain value is clamped to be ≥ the previous one (an op "ready" before its anchor has
  a 0 boundary gap); a binding predecessor completed no later than its successor became ready,
  so the chain still ends exactly at the terminal completion.
- Straggler ops of a k-of-n join that finish after the root's final op are off the path: the
  path ends at the final op, as root latency does, and still reconciles to it.
- Only dependencies that completed at or before the op became ready can bind. Under the
  non-causal reference arms (Flat, Arrival) an op may be released before a dependency finished;
  that dependency did not delay it, so the path does not go through it.
- Only final attempts are walked (see `metrics.task.final_attempts`).

Examples:
    >>> from maserve_prefect.trace.model import (Dep, EdgeKind, Manifest, OpKind, OpRecord,
    ...     OpTimes, RootRecord)
    >>> a = OpRecord(op_id="a", root_id="r", kind=OpKind.MODEL, times=OpTimes(
    ...     ready_s=0.0, submitted_s=0.5, first_scheduled_s=1.0, completed_s=2.0))
    >>> b = OpRecord(op_id="b", root_id="r", kind=OpKind.MODEL,
    ...     deps=(Dep(op_id="a", kind=EdgeKind.DATA),), times=OpTimes(
    ...     ready_s=2.5, submitted_s=2.5, first_scheduled_s=3.0, completed_s=4.0))
    >>> t = Trace(manifest=Manifest(trace_id="t"), roots=[RootRecord(root_id="r")], ops=[a, b])
    >>> p = path_ledger(t)[0]
    >>> [s.op_id for s in p.segments], p.boundary_gap_s, p.backend_wait_s, p.total_s
    (['a', 'b'], 0.5, 1.0, 4.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from maserve_prefect.errors import TraceValidationError
from maserve_prefect.metrics.task import RootStatus, final_attempts, root_latencies
from maserve_prefect.trace.model import OpRecord, OpStatus, Trace

SEGMENTS = ("boundary_gap_s", "pre_submission_s", "backend_wait_s", "scheduled_residence_s")


@dataclass(frozen=True, slots=True)
class PathSegment:
    """One op on the critical path and its four segments (seconds, each ≥ 0)."""

    op_id: str
    binding_pred: str | None
    boundary_gap_s: float
    pre_submission_s: float
    backend_wait_s: float
    scheduled_residence_s: float

    @property
    def total_s(self) -> float:
        return (
            self.boundary_gap_s
            + self.pre_submission_s
            + self.backend_wait_s
            + self.scheduled_residence_s
        )


@dataclass(frozen=True, slots=True)
class RootPath:
    """The completion path of one completed root, first op first."""

    root_id: str
    workload_class: str
    latency_s: float
    segments: tuple[PathSegment, ...]

    def _sum(self, name: str) -> float:
        return float(sum(getattr(s, name) for s in self.segments))

    @property
    def boundary_gap_s(self) -> float:
        return self._sum("boundary_gap_s")

    @property
    def pre_submission_s(self) -> float:
        return self._sum("pre_submission_s")

    @property
    def backend_wait_s(self) -> float:
        return self._sum("backend_wait_s")

    @property
    def scheduled_residence_s(self) -> float:
        return self._sum("scheduled_residence_s")

    @property
    def total_s(self) -> float:
        return float(sum(s.total_s for s in self.segments))

    def totals(self) -> dict[str, float]:
        """The four segment totals by name (`SEGMENTS` order)."""
        return {name: self._sum(name) for name in SEGMENTS}


def _binding_pred(op: OpRecord, finals: dict[str, OpRecord]) -> OpRecord | None:
    ready = op.times.ready_s
    best: OpRecord | None = None
    for dep in op.deps:
        pred = finals.get(dep.op_id)
        if pred is None:
            raise TraceValidationError(
                f"op {op.op_id!r} depends on {dep.op_id!r}, which is not in the trace; "
                "validate the trace (trace.validate) before computing metrics"
            )
        done = pred.times.completed_s
        if done is None or pred.status is not OpStatus.COMPLETED:
            continue
        if ready is not None and done > ready:
            continue  # released before this dep finished (non-causal arm): it did not bind
        if best is None or (done, pred.op_id) > (best.times.completed_s or 0.0, best.op_id):
            best = pred
    return best


def critical_path(terminal: OpRecord, finals: dict[str, OpRecord]) -> list[OpRecord]:
    """Ops from the path's first op to `terminal`, following binding predecessors."""
    path = [terminal]
    seen = {terminal.op_id}
    while (pred := _binding_pred(path[-1], finals)) is not None:
        if pred.op_id in seen:
            raise TraceValidationError(
                f"op {pred.op_id!r} is on a dependency cycle; the op graph must be acyclic"
            )
        seen.add(pred.op_id)
        path.append(pred)
    path.reverse()
    return path


def _segments(path: list[OpRecord], arrival_s: float) -> tuple[tuple[PathSegment, ...], float]:
    out = []
    anchor = arrival_s
    prev_id: str | None = None
    for op in path:
        chain = [anchor]
        t = op.times
        for raw in (t.ready_s, t.submitted_s, t.first_scheduled_s, t.completed_s):
            chain.append(chain[-1] if raw is None else max(chain[-1], raw))
        gap, pre, wait, res = (b - a for a, b in pairwise(chain))
        out.append(PathSegment(op.op_id, prev_id, gap, pre, wait, res))
        anchor, prev_id = chain[-1], op.op_id
    return tuple(out), anchor


def _starts_after_completion(op: OpRecord) -> bool:
    t = op.times
    done = t.completed_s
    starts = (t.ready_s, t.submitted_s, t.first_scheduled_s)
    return done is not None and any(x is not None and x > done for x in starts)


def path_ledger(trace: Trace) -> list[RootPath]:
    """The completion path of every completed root, in root record order.

    Failed and incomplete roots have no root latency and no path (see `metrics.task.attempts`).

    Raises:
        TraceValidationError: a dependency is missing from the trace or the graph has a cycle.
    """
    finals = final_attempts(trace.ops)
    out = []
    for lat in root_latencies(trace):
        if lat.status is not RootStatus.COMPLETED or lat.terminal_op_id is None:
            continue
        path = critical_path(finals[lat.terminal_op_id], finals)
        segs, end_s = _segments(path, lat.arrival_s)
        if end_s != lat.completed_s:
            bad = [op.op_id for op in path if _starts_after_completion(op)]
            raise TraceValidationError(
                f"root {lat.root_id!r}: critical-path op(s) {bad} have a ready, submitted or "
                f"first-scheduled time after their own completion, so the path ends at {end_s} s "
                f"instead of {lat.completed_s} s; fix those ops' times"
            )
        out.append(RootPath(lat.root_id, lat.workload_class, lat.latency_s or 0.0, segs))
    return out


def path_shares(paths: list[RootPath]) -> dict[str, float]:
    """Mean share of root latency per segment over `paths` (roots of zero latency skipped).

    Examples:
        >>> path_shares([])
        {'boundary_gap_s': 0.0, 'pre_submission_s': 0.0, 'backend_wait_s': 0.0, 'scheduled_residence_s': 0.0}
    """
    shares = {name: 0.0 for name in SEGMENTS}
    used = [p for p in paths if p.latency_s > 0]
    for p in used:
        for name, v in p.totals().items():
            shares[name] += v / p.latency_s / len(used)
    return shares
