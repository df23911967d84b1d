"""AIPerf's per-request records as a Semantic Trace: an AIPerf run the task-level metrics can read.

The one idea: `import_aiperf` checks the whole file first (`aiperf_records.read_records`, and
the schedule map when given), then builds a `Trace` — pure, nothing written — that the caller
records in the ledger in one transaction (`Ledger.record_trace`). A bad line or an unknown
conversation refuses the whole file.

Mapping, each request one model op:

- times: `submitted_s` = `ready_s` = `request_start_ns`, `first_token_s` = start + time to first
  token (streaming runs), `completed_s` = `request_end_ns`; each is `(ns - zero_ns) / 1e9`
  from the integer nanoseconds, so it is exact to AIPerf's nanosecond. The clock's zero puts the
  first request's start at its scheduled timestamp when the schedule is known (`--schedule`),
  else at 0 s;
- tokens: `input_sequence_length`, `output_sequence_length` exactly as recorded;
- a request with an `error` (or `was_cancelled`) is a failed op with the error text;
- roots: with the schedule map written by `maserve trace export --aiperf`, each request is
  mapped back (by `conversation_id` and `turn_index`) to its op: original op and root ids,
  workflow, class (so SLO deadlines per class apply), the root's scheduled arrival (else its
  first request's start), final op, and dependencies among the
  requests as control edges (so the completion path is derived; a dependency whose request is
  not in the records is dropped and counted). Without it, roots are AIPerf's sessions
  (`x_correlation_id`, else `conversation_id`), one op per turn (`<root>/turn<k>`), each turn
  depending on the one before (AIPerf sends a session's turns one after another); a
  single-turn dataset gives one root per request.

Records of a phase other than `profiling` (warm-up) are skipped and counted.

Examples:
    >>> import pathlib, tempfile
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "profile_export.jsonl"
    >>> _ = p.write_text('{"metadata": {"conversation_id": "c0", "turn_index": 0, '
    ...     '"request_start_ns": 2000000000, "request_end_ns": 2500000000}, "metrics": {'
    ...     '"input_sequence_length": {"value": 9, "unit": "tokens"}, '
    ...     '"output_sequence_length": {"value": 4, "unit": "tokens"}}, "error": null}\\n')
    >>> op = import_aiperf(p).trace.ops[0]
    >>> op.op_id, op.times.submitted_s, op.times.completed_s, op.num_output_tokens
    ('c0/turn0', 0.0, 0.5, 4)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maserve_prefect.errors import TraceImportError
from maserve_prefect.interop.aiperf_export import MAP_FILE
from maserve_prefect.interop.aiperf_records import PROFILING, AiperfRecord, read_records
from maserve_prefect.trace.model import (
    Dep,
    EdgeKind,
    Manifest,
    OpKind,
    OpRecord,
    OpStatus,
    OpTimes,
    RootRecord,
    Trace,
)
from maserve_prefect.trace.validate import validate_trace

AIPERF_WORKFLOW = "aiperf"
"""Workflow (hence SLO class) of roots imported without a schedule map."""


@dataclass(frozen=True, slots=True)
class MappedOp:
    """One line of `maserve_map.jsonl`: the op a request of the exported schedule stands for."""

    op_id: str
    root_id: str
    trace_id: str
    workflow: str
    workload_class: str
    final: bool
    deps: tuple[str, ...]
    timestamp_ms: float
    root_arrival_ms: float | None = None


@dataclass(slots=True)
class ScheduleMap:
    """The exported schedule's map: (session id, turn) → op, for both exported files."""

    path: Path
    by_key: dict[tuple[str, int], MappedOp] = field(default_factory=dict)

    @property
    def trace_id(self) -> str:
        """The exported trace's id ('' for an empty map)."""
        return next(iter(self.by_key.values())).trace_id if self.by_key else ""


def _map_row(row: Any) -> tuple[MappedOp, str, str, int]:
    if not isinstance(row, dict):
        raise ValueError("expected a JSON object")
    try:
        op = MappedOp(
            op_id=str(row["op_id"]),
            root_id=str(row["root_id"]),
            trace_id=str(row.get("trace_id", "")),
            workflow=str(row.get("workflow", "")),
            workload_class=str(row.get("workload_class", "")),
            final=bool(row.get("final", False)),
            deps=tuple(str(d) for d in row.get("deps", ())),
            timestamp_ms=float(row["timestamp"]),
            root_arrival_ms=None if row.get("root_arrival") is None else float(row["root_arrival"]),
        )
        turn = row["turn"]
        if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
            raise ValueError(f"turn must be an integer >= 0, got {turn!r}")
        return op, str(row["request_session"]), str(row["root_session"]), turn
    except KeyError as exc:
        raise ValueError(f"missing field {exc.args[0]!r}") from None
    except TypeError as exc:
        raise ValueError(str(exc)) from None


def read_schedule_map(schedule: str | Path) -> ScheduleMap:
    """Read the map of an export folder (or the map file itself).

    Raises:
        TraceImportError: no map there, or a line is not a map row (file and line named).
    """
    path = Path(schedule)
    if path.is_dir():
        path = path / MAP_FILE
    out = ScheduleMap(path=path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceImportError(
            f"--schedule {schedule}: cannot read {path} ({exc.strerror}); give the folder "
            "written by `maserve trace export --aiperf`"
        ) from None
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            op, request_session, root_session, turn = _map_row(json.loads(line))
        except (ValueError, json.JSONDecodeError) as exc:
            raise TraceImportError(f"{path}:{line_no}: not a schedule map row ({exc})") from None
        out.by_key[(request_session, 0)] = op
        out.by_key[(root_session, turn)] = op
    return out


@dataclass(slots=True)
class AiperfImport:
    """Result of `import_aiperf`.

    Attributes:
        trace: the AIPerf run as a trace (not yet recorded anywhere).
        num_records: records read.
        num_failed: requests recorded with an error or cancelled (failed ops).
        num_skipped_phase: records of another phase than profiling, left out.
        num_dropped_deps: mapped dependencies whose request is not in the records.
        mapped: whether a schedule map named the ops.
    """

    trace: Trace
    num_records: int
    num_failed: int
    num_skipped_phase: int
    num_dropped_deps: int
    mapped: bool


@dataclass(frozen=True, slots=True)
class _Op:
    rec: AiperfRecord
    op_id: str
    root_id: str
    deps: tuple[str, ...]


def _where(rec: AiperfRecord, path: Path) -> str:
    return f"{path}:{rec.line}"


def _mapped_ops(
    records: list[AiperfRecord], smap: ScheduleMap, path: Path
) -> tuple[list[_Op], dict[str, MappedOp]]:
    ops: list[_Op] = []
    seen: dict[str, AiperfRecord] = {}
    meta: dict[str, MappedOp] = {}
    for rec in records:
        m = smap.by_key.get((rec.conversation_id, rec.turn_index))
        if m is None:
            raise TraceImportError(
                f"{_where(rec, path)}: conversation {rec.conversation_id!r} turn "
                f"{rec.turn_index} is not in the schedule map {smap.path}; import without "
                "--schedule, or give the folder this AIPerf run's input was exported to"
            )
        if m.op_id in seen:
            raise TraceImportError(
                f"{_where(rec, path)}: op {m.op_id!r} was already sent at line "
                f"{seen[m.op_id].line}; each exported request maps to one op, so run AIPerf "
                "with --fixed-schedule (each request once) or import without --schedule"
            )
        seen[m.op_id] = rec
        meta[m.op_id] = m
        ops.append(_Op(rec, m.op_id, m.root_id, m.deps))
    return ops, meta


def _session_ops(records: list[AiperfRecord], path: Path) -> list[_Op]:
    by_root: dict[str, list[AiperfRecord]] = {}
    for rec in records:
        by_root.setdefault(rec.correlation_id or rec.conversation_id, []).append(rec)
    ops: list[_Op] = []
    for root_id, recs in by_root.items():
        recs.sort(key=lambda r: (r.turn_index, r.line))
        prev: AiperfRecord | None = None
        for rec in recs:
            if prev is not None and prev.turn_index == rec.turn_index:
                raise TraceImportError(
                    f"{_where(rec, path)}: session {root_id!r} turn {rec.turn_index} already "
                    f"recorded at line {prev.line}; a file holds each request once"
                )
            deps = (f"{root_id}/turn{prev.turn_index}",) if prev is not None else ()
            ops.append(_Op(rec, f"{root_id}/turn{rec.turn_index}", root_id, deps))
            prev = rec
    return ops


def _topological(ops: list[_Op]) -> list[_Op]:
    """`ops` by request start, each after the ops it depends on (the ledger's append order)."""
    by_id = {o.op_id: o for o in ops}
    done: set[str] = set()
    out: list[_Op] = []
    for start in sorted(ops, key=lambda o: (o.rec.start_ns, o.rec.line)):
        stack = [(start, False)]
        while stack:
            op, expanded = stack.pop()
            if op.op_id in done:
                continue
            if expanded:
                done.add(op.op_id)
                out.append(op)
                continue
            stack.append((op, True))
            stack.extend((by_id[d], False) for d in reversed(op.deps) if d not in done)
    return out


def import_aiperf(
    path: str | Path, *, schedule: str | Path | None = None, trace_id: str | None = None
) -> AiperfImport:
    """Read AIPerf's `profile_export.jsonl` into a trace (see the module docstring).

    Args:
        path: the per-request records file.
        schedule: the folder (or its `maserve_map.jsonl`) written by `maserve trace export
            --aiperf` for this run's input, to map requests back to ops.
        trace_id: the new trace's id (default `aiperf-<folder>-<sha256 prefix>`).

    Raises:
        TraceImportError: a record or map line is bad, a request is not in the map, or no
            profiling record is left; the message names the file and line.
    """
    rf = read_records(path)
    path = rf.path
    kept = [r for r in rf.records if r.phase == PROFILING]
    if not kept:
        raise TraceImportError(
            f"{path}: no record of the profiling phase ({len(rf.records)} records of other "
            "phases); give the records of a profiling run"
        )
    smap = read_schedule_map(schedule) if schedule is not None else None
    if smap is not None:
        ops, meta = _mapped_ops(kept, smap, path)
    else:
        ops, meta = _session_ops(kept, path), {}
    present = {o.op_id for o in ops}
    dropped = sum(1 for o in ops for d in o.deps if d not in present)
    ops = [_Op(o.rec, o.op_id, o.root_id, tuple(d for d in o.deps if d in present)) for o in ops]
    first = min(kept, key=lambda r: (r.start_ns, r.line))
    zero_ns = first.start_ns
    if smap is not None:
        first_op = next(o for o in ops if o.rec is first)
        zero_ns -= round(meta[first_op.op_id].timestamp_ms * 1_000_000)

    def sec(ns: int | None) -> float | None:
        return None if ns is None else (ns - zero_ns) / 1e9

    records: list[OpRecord] = []
    arrival: dict[str, float] = {}
    for o in _topological(ops):
        rec = o.rec
        start = (rec.start_ns - zero_ns) / 1e9
        arrival[o.root_id] = min(arrival.get(o.root_id, start), start)
        records.append(
            OpRecord(
                op_id=o.op_id,
                root_id=o.root_id,
                kind=OpKind.MODEL,
                deps=tuple(Dep(op_id=d, kind=EdgeKind.CONTROL) for d in o.deps),
                num_input_tokens=rec.num_input_tokens,
                num_output_tokens=rec.num_output_tokens,
                times=OpTimes(
                    ready_s=start,
                    submitted_s=start,
                    first_token_s=sec(rec.first_token_ns),
                    completed_s=sec(rec.end_ns),
                ),
                status=OpStatus.COMPLETED if rec.error is None else OpStatus.FAILED,
                error=rec.error,
            )
        )
    by_root: dict[str, list[MappedOp]] = {}
    for m in meta.values():
        by_root.setdefault(m.root_id, []).append(m)
    for rid, mine in by_root.items():  # the schedule's root arrival, on the aligned clock
        lead = mine[0].root_arrival_ms
        if rid in arrival and lead is not None:
            arrival[rid] = min(arrival[rid], lead / 1000)
    roots = [_root(rid, t, by_root.get(rid, []), present) for rid, t in _by_first(arrival)]
    tid = trace_id or f"aiperf-{path.parent.name or path.stem}-{rf.sha256[:12]}"
    manifest = Manifest(
        trace_id=tid,
        source="aiperf",
        notes={
            "file": path.name,
            "sha256": rf.sha256,
            "num_records": len(rf.records),
            "clock_zero_ns": zero_ns,
            **({"schedule": str(smap.path), "exported_trace": smap.trace_id} if smap else {}),
        },
    )
    trace = Trace(manifest=manifest, roots=roots, ops=records)
    validate_trace(trace, source=str(path))
    return AiperfImport(
        trace=trace,
        num_records=len(rf.records),
        num_failed=sum(1 for r in kept if r.error is not None),
        num_skipped_phase=len(rf.records) - len(kept),
        num_dropped_deps=dropped,
        mapped=smap is not None,
    )


def _by_first(arrival: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(arrival.items(), key=lambda kv: kv[1])


def _root(root_id: str, arrival_s: float, mine: list[MappedOp], present: set[str]) -> RootRecord:
    final = next((m.op_id for m in mine if m.final and m.op_id in present), None)
    return RootRecord(
        root_id=root_id,
        workflow=mine[0].workflow if mine else AIPERF_WORKFLOW,
        workload_class=mine[0].workload_class if mine else "",
        arrival_s=arrival_s,
        final_op_id=final,
    )
