"""The trace ledger: the single, synchronous source of truth for what ran.

The one idea: **every write is one transaction, committed before the call returns.** On SQLite
(WAL, `synchronous=FULL`, see `trace.db`) that means an op appended is on disk when
`append_op` returns, so a process killed after N appends leaves N complete ops — the op row, its
edges and its payload references are written together or not at all. Payload bytes go to the
content-addressed store *before* the row that references them, so a recorded op never points at a
missing blob (a crash in between leaves only an unreferenced blob, which is harmless).

Appends are checked as they arrive, naming the op: the run must exist, `(op_id, attempt)` must
be new, every dependency must name an op already recorded in the run (so the recorded graph is
acyclic by construction), the op's root must have been added, and every digest it references
must be in the store. A retried op is recorded as the same `op_id` with `attempt + 1`.

Prefect ids live beside the records, not in them: `begin_run(..., flow_run_id=)` and
`link_prefect(...)` fill `RunRow.flow_run_id` and the link table, keeping bundles deterministic.
So does a tool op's measured wall duration (`append_op(..., tool_wall_s=)`, read back with
`tool_wall_times`): the record's `tool_duration_s` is on the run's clock.

Opening a ledger creates missing tables, upgrades a database written by an earlier version in
place, and refuses one written by a later version (`trace.schema`).

All methods are thread-safe (the task runner calls them from worker threads); one lock
serializes database access, which SQLite serializes anyway. The tables are `trace.tables`, the
engine factory `trace.db`, and the values reads return (`RunStatus`, `RunInfo`, `PrefectLink`,
re-exported here) `trace.runs`.

Examples:
    >>> from maserve_prefect.trace.cas import MemoryStore
    >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, RootRecord
    >>> ledger = Ledger("sqlite://", MemoryStore())
    >>> ledger.begin_run(Manifest(trace_id="t1"))
    >>> ledger.add_root("t1", RootRecord(root_id="r0"))
    >>> ledger.append_op("t1", OpRecord(op_id="r0/op0", root_id="r0", kind=OpKind.MODEL))
    >>> [op.op_id for op in ledger.load_trace("t1").ops]
    ['r0/op0']
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime

from sqlalchemy import func, insert
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import IntegrityError as DBIntegrityError
from sqlmodel import Session, SQLModel, col, select

from maserve_prefect.errors import IntegrityError, TraceNotFoundError, TraceValidationError
from maserve_prefect.trace.cas import BlobStore, ContentStore
from maserve_prefect.trace.db import create_tables, make_engine
from maserve_prefect.trace.model import (
    EngineSample,
    Manifest,
    OpRecord,
    RootRecord,
    SessionRecord,
    StageRecord,
    Trace,
)
from maserve_prefect.trace.owner import current_owner, owner_alive
from maserve_prefect.trace.runs import PrefectLink, RunInfo, RunStatus
from maserve_prefect.trace.tables import (
    OpRow,
    PrefectLinkRow,
    RootRow,
    RunRow,
    SampleLike,
    SampleRow,
    SessionRow,
    StageRow,
    op_rows,
    payload_refs,
    root_row,
    sample_row,
    session_row,
    stage_row,
)

__all__ = ["Ledger", "PrefectLink", "RunInfo", "RunStatus", "SampleLike"]

# A finished run whose trace holds only what finished: `load_trace` notes it in the manifest.
PARTIAL_STATUSES = frozenset(
    {RunStatus.FAILED.value, RunStatus.CANCELLED.value, RunStatus.CRASHED.value}
)


class Ledger:
    """Synchronous, durable recorder and loader of Semantic Traces.

    Args:
        db: a SQLAlchemy URL or an `Engine` (from `trace.db.make_engine`).
        cas: where payload bytes live.
    """

    def __init__(self, db: str | URL | Engine, cas: BlobStore) -> None:
        self._owns_engine = not isinstance(db, Engine)
        if isinstance(db, Engine):
            create_tables(db)  # a caller's engine may be fresh or old: create / upgrade it
            self.engine: Engine = db
        else:
            self.engine = make_engine(db)
        self.cas = cas
        self._lock = threading.RLock()
        self.crashed = self.mark_crashed_runs()
        """Runs this ledger found running without a live owner and marked crashed on opening."""

    @classmethod
    def from_settings(cls) -> Ledger:
        """The ledger at `MASERVE_LEDGER_URL` with the store at `MASERVE_CAS_DIR` (see `settings`)."""
        from maserve_prefect.settings import get_settings

        s = get_settings()
        return cls(s.ledger_url, ContentStore(s.cas_dir))

    def close(self) -> None:
        """Release database connections (only if this ledger opened the engine)."""
        if self._owns_engine:
            self.engine.dispose()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ---- writes -------------------------------------------------------------------------------

    def begin_run(self, manifest: Manifest, *, flow_run_id: str | None = None) -> None:
        """Record a new run. `created_at` is filled with the current UTC time when absent.

        Raises:
            TraceValidationError: a run with this trace id is already recorded.
        """
        created_at = manifest.created_at or datetime.now(UTC).isoformat()
        manifest = manifest.model_copy(update={"created_at": created_at})
        with self._write(f"run {manifest.trace_id!r}") as session:
            if session.get(RunRow, manifest.trace_id) is not None:
                raise TraceValidationError(
                    f"run {manifest.trace_id!r} is already recorded in the ledger; "
                    f"use a new trace id for a new run"
                )
            session.add(
                RunRow(
                    trace_id=manifest.trace_id,
                    manifest_json=manifest.to_json_line(),
                    created_at=created_at,
                    status=RunStatus.RUNNING.value,
                    source=manifest.source,
                    flow_run_id=flow_run_id,
                    owner=current_owner(),
                )
            )

    def finish_run(self, trace_id: str, status: RunStatus | str = RunStatus.COMPLETED) -> None:
        """Mark a run finished with `status` (completed, failed or cancelled)."""
        status = RunStatus(status)
        with self._write(f"run {trace_id!r}") as session:
            row = self._run_row(session, trace_id)
            row.status = status.value
            row.finished_at = datetime.now(UTC).isoformat() if status.is_finished else None
            session.add(row)

    def mark_crashed_runs(self) -> list[str]:
        """Mark `crashed` every run still `running` whose owner process is gone; return them.

        A run's owner (`trace.owner`) is recorded by `begin_run`; a run on another host, or
        recorded before owners were, is left as it is (nothing here can tell).
        """
        with self._write("crashed runs") as session:
            rows = session.exec(
                select(RunRow).where(RunRow.status == RunStatus.RUNNING.value)
            ).all()
            crashed = [r for r in rows if r.owner and owner_alive(r.owner) is False]
            now = datetime.now(UTC).isoformat()
            for row in crashed:
                row.status = RunStatus.CRASHED.value
                row.finished_at = now
                session.add(row)
            return [r.trace_id for r in crashed]

    def add_root(self, trace_id: str, root: RootRecord) -> None:
        """Record a root task instance of the run."""
        with self._write(f"root {root.root_id!r} of run {trace_id!r}") as session:
            self._run_row(session, trace_id)
            session.add(root_row(trace_id, root))

    def set_root_final(self, trace_id: str, root_id: str, op_id: str) -> None:
        """Name `op_id` as the op that produced root `root_id`'s final artifact.

        One transaction rewrites the stored root record with `final_op_id` set; nothing else
        in the row changes. Setting it again (a later answer) replaces it.

        Raises:
            TraceNotFoundError: no run `trace_id`.
            TraceValidationError: the root is not recorded, or `op_id` is not a recorded op of
                that root (record the op with `append_op` first).

        Examples:
            >>> from maserve_prefect.trace.cas import MemoryStore
            >>> from maserve_prefect.trace.model import OpKind
            >>> lg = Ledger("sqlite://", MemoryStore())
            >>> lg.begin_run(Manifest(trace_id="t")); lg.add_root("t", RootRecord(root_id="r"))
            >>> lg.append_op("t", OpRecord(op_id="r/0", root_id="r", kind=OpKind.MODEL))
            >>> lg.set_root_final("t", "r", "r/0")
            >>> lg.load_trace("t").roots[0].final_op_id
            'r/0'
        """
        where = f"final op {op_id!r} of root {root_id!r} of run {trace_id!r}"
        with self._write(where) as session:
            self._run_row(session, trace_id)
            row = session.exec(
                select(RootRow).where(RootRow.trace_id == trace_id, RootRow.root_id == root_id)
            ).first()
            if row is None:
                raise TraceValidationError(
                    f"{where}: the root is not recorded; call add_root first"
                )
            owners = set(
                session.exec(
                    select(OpRow.root_id)
                    .where(OpRow.trace_id == trace_id, OpRow.op_id == op_id)
                    .distinct()
                )
            )
            if not owners:
                raise TraceValidationError(
                    f"{where}: the op is not recorded in this run; append it before naming it final"
                )
            if owners != {root_id}:
                raise TraceValidationError(
                    f"{where}: the op belongs to root {sorted(owners)[0]!r}; name an op of the "
                    "root itself"
                )
            record = RootRecord.model_validate_json(row.record_json)
            row.record_json = record.model_copy(update={"final_op_id": op_id}).to_json_line()
            session.add(row)

    def add_stage(self, trace_id: str, stage: StageRecord) -> None:
        """Record a stage instance; its root must already be recorded."""
        with self._write(f"stage {stage.stage_id!r} of run {trace_id!r}") as session:
            self._require_root(session, trace_id, stage.root_id, f"stage {stage.stage_id!r}")
            session.add(stage_row(trace_id, stage))

    def add_session(self, trace_id: str, sess: SessionRecord) -> None:
        """Record a participant session; its root must already be recorded."""
        with self._write(f"session {sess.session_id!r} of run {trace_id!r}") as session:
            self._require_root(session, trace_id, sess.root_id, f"session {sess.session_id!r}")
            session.add(session_row(trace_id, sess))

    def append_op(
        self,
        trace_id: str,
        op: OpRecord,
        *,
        payloads: Mapping[str, bytes] | None = None,
        prefect: tuple[str | None, str | None] | None = None,
        tool_wall_s: float | None = None,
    ) -> None:
        """Record one op attempt durably: row, edges and payload refs in one transaction.

        Args:
            trace_id: the run.
            op: the record; a retry is the same `op_id` with a higher `attempt`.
            payloads: digest → bytes for blobs the op references that are not yet stored;
                they are written to the store before the op row.
            prefect: (flow_run_id, task_run_id) of the Prefect task run that executed the op,
                linked in the same transaction (one durable write per op instead of two).
            tool_wall_s: a tool op's measured wall duration, stored beside the record (which
                keeps only the duration on the run's clock); read back with `tool_wall_times`.

        Raises:
            IntegrityError: a payload's bytes do not hash to its key.
            TraceValidationError: the op id + attempt exists, a dependency names an op not yet
                recorded (or the op itself), the root is unknown, a digest is not stored, or
                `tool_wall_s` is negative or not finite.

        Examples:
            >>> from maserve_prefect.trace.cas import MemoryStore, sha256_hex
            >>> from maserve_prefect.trace.model import Manifest, OpKind, RootRecord
            >>> lg = Ledger("sqlite://", MemoryStore())
            >>> lg.begin_run(Manifest(trace_id="t")); lg.add_root("t", RootRecord(root_id="r"))
            >>> out = b"answer"
            >>> op = OpRecord(op_id="r/0", root_id="r", kind=OpKind.MODEL, output_ref=sha256_hex(out))
            >>> lg.append_op("t", op, payloads={sha256_hex(out): out})
        """
        where = f"op {op.op_id!r} attempt {op.attempt} of run {trace_id!r}"
        if tool_wall_s is not None and not (math.isfinite(tool_wall_s) and tool_wall_s >= 0):
            raise TraceValidationError(
                f"{where}: tool_wall_s={tool_wall_s!r} is not a wall duration; pass the measured "
                "seconds (finite, >= 0) or None"
            )
        for digest, data in (payloads or {}).items():
            actual = self.cas.put(data)
            if actual != digest:
                raise IntegrityError(
                    f"{where}: payload given for digest {digest} hashes to {actual}; "
                    f"key payloads by sha256_hex(data)"
                )
        missing = sorted({d for _, _, d in payload_refs(op) if not self.cas.has(d)})
        if missing:
            raise TraceValidationError(
                f"{where} references {len(missing)} blob(s) not in the store "
                f"(first: {missing[0]}); pass their bytes in `payloads=` or put them first"
            )
        dep_ids = {d.op_id for d in op.deps}
        with self._write(where) as session:
            self._require_root(session, trace_id, op.root_id, f"op {op.op_id!r}")
            dup = session.exec(
                select(OpRow.id).where(
                    OpRow.trace_id == trace_id, OpRow.op_id == op.op_id, OpRow.attempt == op.attempt
                )
            ).first()
            if dup is not None:
                raise TraceValidationError(
                    f"{where} is already recorded; record a retry as attempt {op.attempt + 1}"
                )
            if op.op_id in dep_ids:
                raise TraceValidationError(f"{where} depends on itself; remove that dependency")
            if dep_ids:
                known = set(
                    session.exec(
                        select(OpRow.op_id)
                        .where(OpRow.trace_id == trace_id, col(OpRow.op_id).in_(dep_ids))
                        .distinct()
                    )
                )
                unknown = sorted(dep_ids - known)
                if unknown:
                    raise TraceValidationError(
                        f"{where} depends on {unknown} which are not recorded in this run; "
                        f"append predecessors before the ops that depend on them"
                    )
            session.add_all(op_rows(trace_id, op, tool_wall_s=tool_wall_s))
            if prefect is not None:
                session.add(
                    PrefectLinkRow(
                        trace_id=trace_id,
                        op_id=op.op_id,
                        attempt=op.attempt,
                        flow_run_id=prefect[0],
                        task_run_id=prefect[1],
                    )
                )

    def record_trace(self, trace: Trace, status: RunStatus = RunStatus.COMPLETED) -> None:
        """Record a whole imported trace — run, roots, stages, sessions, ops — in ONE transaction.

        For traces that arrive complete (imports such as `maserve trace import-aiperf`): either
        every record is written or, on any error, none is. Ops are written in record order, so a
        dependency must come before the op that names it. Payload digests are not checked
        (imports carry none); validate the trace first (`trace.validate.validate_trace`).

        Raises:
            TraceValidationError: the trace id is already recorded, or ids clash.

        Examples:
            >>> from maserve_prefect.trace.cas import MemoryStore
            >>> from maserve_prefect.trace.model import OpKind
            >>> lg = Ledger("sqlite://", MemoryStore())
            >>> t = Trace(manifest=Manifest(trace_id="imp"), roots=[RootRecord(root_id="r")],
            ...           ops=[OpRecord(op_id="r/0", root_id="r", kind=OpKind.MODEL)])
            >>> lg.record_trace(t)
            >>> [(r.trace_id, r.status.value, r.num_ops) for r in lg.list_runs()]
            [('imp', 'completed', 1)]
        """
        manifest = trace.manifest
        tid = manifest.trace_id
        now = datetime.now(UTC).isoformat()
        manifest = manifest.model_copy(update={"created_at": manifest.created_at or now})
        with self._write(f"imported run {tid!r}") as session:
            if session.get(RunRow, tid) is not None:
                raise TraceValidationError(
                    f"run {tid!r} is already recorded in the ledger; use a new trace id"
                )
            session.add(
                RunRow(
                    trace_id=tid,
                    manifest_json=manifest.to_json_line(),
                    created_at=manifest.created_at or now,
                    status=status.value,
                    source=manifest.source,
                    finished_at=now if status.is_finished else None,
                )
            )
            session.flush()  # the other tables' rows reference the run row: insert it first
            rows: list[SQLModel] = [root_row(tid, r) for r in trace.roots]
            rows += [stage_row(tid, s) for s in trace.stages]
            rows += [session_row(tid, s) for s in trace.sessions]
            for op in trace.ops:
                rows += op_rows(tid, op)
            by_table: dict[type[SQLModel], list[dict[str, object]]] = {}
            for row in rows:  # bulk inserts, one per table, in record order
                by_table.setdefault(type(row), []).append(row.model_dump(exclude={"id"}))
            for table, values in by_table.items():
                session.connection().execute(insert(table), values)

    def append_samples(self, trace_id: str, samples: Iterable[SampleLike]) -> int:
        """Append engine-state samples in one transaction (a bulk insert); return the count.

        Examples:
            >>> from maserve_prefect.trace.cas import MemoryStore
            >>> lg = Ledger("sqlite://", MemoryStore()); lg.begin_run(Manifest(trace_id="t"))
            >>> lg.append_samples("t", [("replica0", 0.5, "vllm:num_requests_running", 3.0)])
            1
        """
        rows = [sample_row(trace_id, s) for s in samples]
        if not rows:
            return 0
        with self._write(f"samples of run {trace_id!r}") as session:
            self._run_row(session, trace_id)
            session.connection().execute(insert(SampleRow), rows)
        return len(rows)

    def link_prefect(
        self,
        trace_id: str,
        op_id: str,
        attempt: int = 1,
        *,
        flow_run_id: str | None,
        task_run_id: str | None,
    ) -> None:
        """Record (or update) which Prefect task run executed an op attempt."""
        where = f"Prefect link of op {op_id!r} attempt {attempt} of run {trace_id!r}"
        with self._write(where) as session:
            self._run_row(session, trace_id)
            row = session.exec(
                select(PrefectLinkRow).where(
                    PrefectLinkRow.trace_id == trace_id,
                    PrefectLinkRow.op_id == op_id,
                    PrefectLinkRow.attempt == attempt,
                )
            ).first()
            if row is None:
                row = PrefectLinkRow(trace_id=trace_id, op_id=op_id, attempt=attempt)
            row.flow_run_id = flow_run_id
            row.task_run_id = task_run_id
            session.add(row)

    # ---- reads --------------------------------------------------------------------------------

    def load_trace(self, trace_id: str) -> Trace:
        """The run as a `Trace`, records in append order, manifest including `created_at`.

        Raises:
            TraceNotFoundError: no run with this id.
        """
        with self._lock, Session(self.engine) as session:
            run = self._run_row(session, trace_id)

            def records(table: type[RootRow | StageRow | SessionRow | OpRow]) -> list[str]:
                stmt = select(table.record_json).where(table.trace_id == trace_id)
                return list(session.exec(stmt.order_by(col(table.id))))

            samples = session.exec(
                select(SampleRow.source, SampleRow.t_s, SampleRow.name, SampleRow.value)
                .where(SampleRow.trace_id == trace_id)
                .order_by(col(SampleRow.id))
            ).all()
            manifest = Manifest.model_validate_json(run.manifest_json)
            if run.status in PARTIAL_STATUSES:  # the bundle says it holds only what finished
                manifest = manifest.model_copy(
                    update={"notes": {**manifest.notes, "partial": run.status}}
                )
            return Trace(
                manifest=manifest,
                roots=[RootRecord.model_validate_json(j) for j in records(RootRow)],
                stages=[StageRecord.model_validate_json(j) for j in records(StageRow)],
                sessions=[SessionRecord.model_validate_json(j) for j in records(SessionRow)],
                ops=[OpRecord.model_validate_json(j) for j in records(OpRow)],
                samples=[
                    EngineSample(source=src, t_s=t, name=name, value=v)
                    for src, t, name, v in samples
                ],
            )

    def tool_wall_times(self, trace_id: str) -> dict[tuple[str, int], float]:
        """Measured wall durations of a run's tool ops, keyed by `(op_id, attempt)`.

        Only attempts appended with a `tool_wall_s` appear (a simulated run's tools still
        measure one; imported traces have none).

        Raises:
            TraceNotFoundError: no run with this id.

        Examples:
            >>> from maserve_prefect.trace.cas import MemoryStore
            >>> from maserve_prefect.trace.model import OpKind, RootRecord
            >>> lg = Ledger("sqlite://", MemoryStore())
            >>> lg.begin_run(Manifest(trace_id="t")); lg.add_root("t", RootRecord(root_id="r"))
            >>> lg.append_op("t", OpRecord(op_id="r/0", root_id="r", kind=OpKind.TOOL),
            ...              tool_wall_s=0.5)
            >>> lg.tool_wall_times("t")
            {('r/0', 1): 0.5}
        """
        with self._lock, Session(self.engine) as session:
            self._run_row(session, trace_id)
            rows = session.exec(
                select(OpRow.op_id, OpRow.attempt, OpRow.tool_wall_s)
                .where(OpRow.trace_id == trace_id, col(OpRow.tool_wall_s).is_not(None))
                .order_by(col(OpRow.id))
            ).all()
            return {(op_id, attempt): wall for op_id, attempt, wall in rows if wall is not None}

    def list_runs(self) -> list[RunInfo]:
        """Every recorded run, oldest first, with its op count (attempts included)."""
        with self._lock, Session(self.engine) as session:
            counts = dict(
                session.exec(
                    select(OpRow.trace_id, func.count(col(OpRow.id))).group_by(col(OpRow.trace_id))
                ).all()
            )
            runs = session.exec(
                select(RunRow).order_by(col(RunRow.created_at), col(RunRow.trace_id))
            ).all()
            return [
                RunInfo(
                    trace_id=r.trace_id,
                    status=RunStatus(r.status),
                    source=r.source,
                    created_at=r.created_at,
                    finished_at=r.finished_at,
                    flow_run_id=r.flow_run_id,
                    num_ops=int(counts.get(r.trace_id, 0)),
                )
                for r in runs
            ]

    def runs_of_flow_run(self, flow_run_id: str) -> list[str]:
        """Trace ids recorded under a Prefect flow run (directly or via op links)."""
        with self._lock, Session(self.engine) as session:
            direct = session.exec(select(RunRow.trace_id).where(RunRow.flow_run_id == flow_run_id))
            linked = session.exec(
                select(PrefectLinkRow.trace_id).where(PrefectLinkRow.flow_run_id == flow_run_id)
            )
            return sorted(set(direct) | set(linked))

    def prefect_links(self, trace_id: str) -> list[PrefectLink]:
        """The Prefect task runs linked to ops of a run, in link order."""
        with self._lock, Session(self.engine) as session:
            self._run_row(session, trace_id)
            rows = session.exec(
                select(PrefectLinkRow)
                .where(PrefectLinkRow.trace_id == trace_id)
                .order_by(col(PrefectLinkRow.id))
            ).all()
            return [PrefectLink(r.op_id, r.attempt, r.flow_run_id, r.task_run_id) for r in rows]

    # ---- helpers ------------------------------------------------------------------------------

    @contextmanager
    def _write(self, where: str) -> Iterator[Session]:
        """One locked transaction, committed on exit; a unique-key clash names `where`."""
        with self._lock, Session(self.engine) as session:
            try:
                yield session
                session.commit()
            except DBIntegrityError as exc:
                session.rollback()
                raise TraceValidationError(
                    f"{where} clashes with a record already in the ledger ({exc.orig}); "
                    f"ids must be unique within a run"
                ) from exc
            except BaseException:
                session.rollback()
                raise

    @staticmethod
    def _run_row(session: Session, trace_id: str) -> RunRow:
        row = session.get(RunRow, trace_id)
        if row is None:
            raise TraceNotFoundError(
                f"run {trace_id!r} is not in the ledger; call begin_run first "
                f"(or list recorded runs with Ledger.list_runs)"
            )
        return row

    def _require_root(self, session: Session, trace_id: str, root_id: str, what: str) -> None:
        self._run_row(session, trace_id)
        found = session.exec(
            select(RootRow.id).where(RootRow.trace_id == trace_id, RootRow.root_id == root_id)
        ).first()
        if found is None:
            raise TraceValidationError(
                f"{what} of run {trace_id!r} names root {root_id!r}, which is not recorded; "
                f"call add_root first"
            )
