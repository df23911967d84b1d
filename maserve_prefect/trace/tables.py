"""The trace ledger's SQLModel tables: one row per run, hierarchy record, op attempt, edge,
payload reference, engine-state sample and Prefect link — and how a record becomes rows.

The one idea: every record row keeps the record's full canonical JSON (`record_json`) next to a
few scalar columns that are queried. Loading parses the JSON, so a load reproduces the
`OpRecord` (or root, stage, session) exactly; the scalar columns, `EdgeRow` and `PayloadRefRow`
are indexes into that truth for queries ("which ops consumed this blob?", "edges of this
trace"), written in the same transaction.

Record order is the surrogate autoincrement `id` (portable: SQLite and PostgreSQL both issue
increasing ids), so loads return records in the order they were appended, even with several
writer processes. An op's identity is `(trace_id, op_id, attempt)`, enforced by a unique
constraint; a retried op is a new row with `attempt + 1`.

Prefect ids are deliberately *not* in `OpRow`: they live in `PrefectLinkRow` (and
`RunRow.flow_run_id`), so the records — and therefore exported bundles — stay byte-identical
across deterministic runs. For the same reason a tool op's measured wall duration is a column of
`OpRow` (`tool_wall_s`) and not a field of the record: the record's `tool_duration_s` is on the
run's clock (virtual on the simulator), the wall time varies from run to run.

Schema changes: a column added to a table after its first release is nullable (rows written
before it read as None) and is a `Migration` in `trace.schema`, which stamps the database's
schema version and upgrades older databases in place.

Naming: `XBase` holds the columns, `XRow(XBase, table=True)` adds keys (the SQLModel docs'
pattern; `Row` avoids clashing with `sqlmodel.Session` and the record models). Table names carry
a `trace_` prefix so they share a database with other parts of the project.
"""

from __future__ import annotations

from sqlalchemy import Column, Index, Text, UniqueConstraint
from sqlmodel import Field, SQLModel

from maserve_prefect.trace.model import (
    EngineSample,
    OpRecord,
    RootRecord,
    SessionRecord,
    StageRecord,
)

SampleLike = EngineSample | tuple[str, float, str, float]
"""An engine sample as a record or a plain `(source, t_s, name, value)` tuple (cheap to build)."""


class RunBase(SQLModel):
    """One recorded run (a trace)."""

    trace_id: str = Field(primary_key=True)
    manifest_json: str = Field(sa_column=Column(Text, nullable=False))
    created_at: str
    status: str = Field(default="running", index=True)
    source: str = "native"
    flow_run_id: str | None = Field(default=None, index=True)
    finished_at: str | None = None
    owner: str | None = None
    """The process recording the run (`trace.owner`), so a run left running is found crashed."""


class RunRow(RunBase, table=True):
    __tablename__ = "trace_run"


class RootBase(SQLModel):
    """One root task instance of a run."""

    trace_id: str = Field(foreign_key="trace_run.trace_id")
    root_id: str
    workflow: str = ""
    arrival_s: float = 0.0
    record_json: str = Field(sa_column=Column(Text, nullable=False))


class RootRow(RootBase, table=True):
    __tablename__ = "trace_root"
    __table_args__ = (UniqueConstraint("trace_id", "root_id", name="uq_trace_root"),)

    id: int | None = Field(default=None, primary_key=True)


class StageBase(SQLModel):
    """One stage instance of a root."""

    trace_id: str = Field(foreign_key="trace_run.trace_id")
    stage_id: str
    root_id: str
    name: str
    record_json: str = Field(sa_column=Column(Text, nullable=False))


class StageRow(StageBase, table=True):
    __tablename__ = "trace_stage"
    __table_args__ = (UniqueConstraint("trace_id", "stage_id", name="uq_trace_stage"),)

    id: int | None = Field(default=None, primary_key=True)


class SessionBase(SQLModel):
    """One participant session within a stage."""

    trace_id: str = Field(foreign_key="trace_run.trace_id")
    session_id: str
    root_id: str
    stage_id: str = ""
    record_json: str = Field(sa_column=Column(Text, nullable=False))


class SessionRow(SessionBase, table=True):
    __tablename__ = "trace_session"
    __table_args__ = (UniqueConstraint("trace_id", "session_id", name="uq_trace_session"),)

    id: int | None = Field(default=None, primary_key=True)


class OpBase(SQLModel):
    """One attempt of one realized op; `record_json` is the full `OpRecord`.

    `tool_wall_s` is the one value kept here and not in the record: a tool op's measured wall
    duration (None for other ops and for ops recorded without one).
    """

    trace_id: str = Field(foreign_key="trace_run.trace_id")
    op_id: str
    attempt: int = 1
    root_id: str
    stage_id: str = ""
    session_id: str = ""
    kind: str
    role: str = ""
    status: str
    deployment: str = ""
    num_input_tokens: int = 0
    num_output_tokens: int = 0
    submitted_s: float | None = None
    completed_s: float | None = None
    tool_wall_s: float | None = None
    record_json: str = Field(sa_column=Column(Text, nullable=False))


class OpRow(OpBase, table=True):
    __tablename__ = "trace_op"
    __table_args__ = (
        UniqueConstraint("trace_id", "op_id", "attempt", name="uq_trace_op_attempt"),
        Index("ix_trace_op_root", "trace_id", "root_id"),
    )

    id: int | None = Field(default=None, primary_key=True)


class EdgeBase(SQLModel):
    """A typed predecessor edge `src -> dst` of one attempt of `dst`."""

    trace_id: str = Field(foreign_key="trace_run.trace_id")
    src: str
    dst: str
    dst_attempt: int = 1
    kind: str
    required: bool = True


class EdgeRow(EdgeBase, table=True):
    __tablename__ = "trace_edge"
    __table_args__ = (
        Index("ix_trace_edge_dst", "trace_id", "dst", "dst_attempt"),
        Index("ix_trace_edge_src", "trace_id", "src"),
    )

    id: int | None = Field(default=None, primary_key=True)


class PayloadRefBase(SQLModel):
    """A CAS digest an op attempt references, by role (`input`, `output`, `output_token_ids`)."""

    trace_id: str = Field(foreign_key="trace_run.trace_id")
    op_id: str
    attempt: int = 1
    role: str
    position: int = 0
    digest: str = Field(index=True)


class PayloadRefRow(PayloadRefBase, table=True):
    __tablename__ = "trace_payload_ref"
    __table_args__ = (Index("ix_trace_payload_op", "trace_id", "op_id", "attempt"),)

    id: int | None = Field(default=None, primary_key=True)


class SampleBase(SQLModel):
    """One engine-state sample of a run's timeline."""

    trace_id: str = Field(foreign_key="trace_run.trace_id")
    source: str
    t_s: float
    name: str
    value: float


class SampleRow(SampleBase, table=True):
    __tablename__ = "trace_engine_sample"
    __table_args__ = (Index("ix_trace_sample_name", "trace_id", "name", "t_s"),)

    id: int | None = Field(default=None, primary_key=True)


class PrefectLinkBase(SQLModel):
    """Which Prefect task run (of which flow run) executed an op attempt."""

    trace_id: str = Field(foreign_key="trace_run.trace_id")
    op_id: str
    attempt: int = 1
    flow_run_id: str | None = Field(default=None, index=True)
    task_run_id: str | None = Field(default=None, index=True)


class PrefectLinkRow(PrefectLinkBase, table=True):
    __tablename__ = "trace_prefect_link"
    __table_args__ = (
        UniqueConstraint("trace_id", "op_id", "attempt", name="uq_trace_prefect_link"),
    )

    id: int | None = Field(default=None, primary_key=True)


LEDGER_TABLES: tuple[type[SQLModel], ...] = (
    RunRow,
    RootRow,
    StageRow,
    SessionRow,
    OpRow,
    EdgeRow,
    PayloadRefRow,
    SampleRow,
    PrefectLinkRow,
)
"""Every ledger table, parents first (the order `create_all` / deletes rely on)."""


def payload_refs(op: OpRecord) -> list[tuple[str, int, str]]:
    """`(role, position, digest)` for every blob an op references."""
    refs = [("input", i, d) for i, d in enumerate(op.input_refs)]
    if op.output_ref is not None:
        refs.append(("output", 0, op.output_ref))
    if op.output_token_ids_ref is not None:
        refs.append(("output_token_ids", 0, op.output_token_ids_ref))
    return refs


def op_rows(trace_id: str, op: OpRecord, *, tool_wall_s: float | None = None) -> list[SQLModel]:
    """The rows one op attempt becomes: its `OpRow`, one `EdgeRow` per dep, its payload refs.

    `tool_wall_s` is a tool op's measured wall duration, kept in the `OpRow` only.
    """
    rows: list[SQLModel] = [
        OpRow(
            trace_id=trace_id,
            op_id=op.op_id,
            attempt=op.attempt,
            root_id=op.root_id,
            stage_id=op.stage_id,
            session_id=op.session_id,
            kind=op.kind.value,
            role=op.role,
            status=op.status.value,
            deployment=op.generation.deployment if op.generation else "",
            num_input_tokens=op.num_input_tokens,
            num_output_tokens=op.num_output_tokens,
            submitted_s=op.times.submitted_s,
            completed_s=op.times.completed_s,
            tool_wall_s=tool_wall_s,
            record_json=op.to_json_line(),
        )
    ]
    rows += [
        EdgeRow(
            trace_id=trace_id,
            src=d.op_id,
            dst=op.op_id,
            dst_attempt=op.attempt,
            kind=d.kind.value,
            required=d.required,
        )
        for d in op.deps
    ]
    rows += [
        PayloadRefRow(
            trace_id=trace_id,
            op_id=op.op_id,
            attempt=op.attempt,
            role=role,
            position=pos,
            digest=digest,
        )
        for role, pos, digest in payload_refs(op)
    ]
    return rows


def root_row(trace_id: str, root: RootRecord) -> RootRow:
    """A root record's row."""
    return RootRow(
        trace_id=trace_id,
        root_id=root.root_id,
        workflow=root.workflow,
        arrival_s=root.arrival_s,
        record_json=root.to_json_line(),
    )


def stage_row(trace_id: str, stage: StageRecord) -> StageRow:
    """A stage record's row."""
    return StageRow(
        trace_id=trace_id,
        stage_id=stage.stage_id,
        root_id=stage.root_id,
        name=stage.name,
        record_json=stage.to_json_line(),
    )


def session_row(trace_id: str, sess: SessionRecord) -> SessionRow:
    """A participant session record's row."""
    return SessionRow(
        trace_id=trace_id,
        session_id=sess.session_id,
        root_id=sess.root_id,
        stage_id=sess.stage_id,
        record_json=sess.to_json_line(),
    )


def sample_row(trace_id: str, s: SampleLike) -> dict[str, object]:
    """A `SampleRow` as a plain dict, for bulk inserts (no model built per sample)."""
    if isinstance(s, EngineSample):
        source, t_s, name, value = s.source, s.t_s, s.name, s.value
    else:
        source, t_s, name, value = s
    return {
        "trace_id": trace_id,
        "source": source,
        "t_s": float(t_s),
        "name": name,
        "value": float(value),
    }
