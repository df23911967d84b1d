"""Semantic Trace v1 records: the in-memory form every other part of the project exchanges.

A trace is a manifest plus hierarchical records — roots, stage instances, sessions and one
`OpRecord` per realized operation — whose typed predecessors (`Dep`) form an acyclic op graph.
Payloads (prompts, artifacts, token ids) are not inline: records hold SHA-256 digests that resolve
in the content-addressed store (`trace.cas`).

These are pydantic models because they live at the edges (ledger rows, bundle lines, imports);
hot loops (the simulator) never build them per step. Every record is frozen; JSON dumps are
deterministic (`to_json_line`) so that bundles are byte-identical across exports.

Identity: `op_id` is unique within a trace and, by convention, hierarchical:
`"{root_id}/{stage_id}/{session}/{n}"` for native runs and `"{root_id}/op0"` for imports. The
Prefect task-run id of an op is *not* part of the record (it lives in the ledger's link table), so a
deterministic run yields a byte-identical bundle.

Examples:
    >>> op = OpRecord(op_id="r0/op0", root_id="r0", kind=OpKind.MODEL, num_input_tokens=10)
    >>> op.deps
    ()
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

SCHEMA_VERSION = "maserve.semantic-trace/1"


class OpKind(StrEnum):
    """What an operation does."""

    MODEL = "model"
    TOOL = "tool"
    TRANSFORM = "transform"
    STATE_READ = "state_read"
    STATE_WRITE = "state_write"


class EdgeKind(StrEnum):
    """Why an op waits for another: it consumes its output (data), is ordered after it (control),
    or reads a state version it wrote (state)."""

    CONTROL = "control"
    DATA = "data"
    STATE = "state"


class DepOrigin(StrEnum):
    """Where a dependency came from: recorded by the run, or added by a legal release change."""

    RECORDED = "recorded"
    BARRIER = "barrier"


class OpStatus(StrEnum):
    """Final status of one attempt of an op."""

    COMPLETED = "completed"
    FAILED = "failed"
    INCOMPLETE = "incomplete"
    SKIPPED = "skipped"
    """Never started: a predecessor failed (Prefect's NotReady) or the run was cancelled first;
    `error` says which."""


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def to_json_line(self) -> str:
        """Deterministic one-line JSON (sorted keys, no spaces)."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


class Dep(_Record):
    """A typed predecessor of an op.

    `required=False` marks an edge replay may relax; `origin=BARRIER` marks a control edge added by
    a legal release change (the DAG rule ignores those, the Barrier rule honours them). Such an
    edge is a *coordination edge*: `stage` names the stage it coordinates within (the paper's
    stage-annotated barrier, `trace.barrier`); recorded deps have no `stage`, and it is left out
    of their serialized form, so traces without barriers serialize as before.
    """

    op_id: str
    kind: EdgeKind
    required: bool = True
    origin: DepOrigin = DepOrigin.RECORDED
    stage: str | None = None

    @property
    def is_coordination(self) -> bool:
        """True for a control edge a legal barrier added (it carries its stage)."""
        return self.origin is DepOrigin.BARRIER and self.stage is not None

    @model_serializer(mode="wrap")
    def _omit_no_stage(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict) and data.get("stage") is None:
            data.pop("stage", None)
        return data


class OpTimes(_Record):
    """Timestamps in seconds on the run's clock (virtual on the simulator, wall otherwise)."""

    ready_s: float | None = None
    submitted_s: float | None = None
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    completed_s: float | None = None


class GenerationSettings(_Record):
    """Settings a model op was issued with."""

    deployment: str = ""
    max_tokens: int | None = None
    min_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    priority: int = 0


class OpRecord(_Record):
    """One realized operation (one attempt).

    Attributes:
        op_id: unique id within the trace.
        root_id / stage_id / session_id: hierarchical identity (stage_id is a stage *instance*).
        kind: model, tool, transform, state_read or state_write.
        role, iteration, round: template metadata (refinement round, debate round, ...).
        deps: typed predecessors.
        input_refs: CAS digests of resolved inputs (prompt messages, consumed artifacts).
        output_ref: CAS digest of the output artifact, if any.
        output_token_ids_ref: CAS digest of the output token ids when the engine returns them.
        num_input_tokens / num_output_tokens / num_cached_tokens: realized token counts.
        prefix_block_hashes / block_size: prefix-block identity of the prompt when known (imports).
        tool_name / tool_duration_s: for tool ops, which tool and its measured duration.
        external_delay_s: a controlled delay before the op may start (think time, tool latency).
        times: ready / submitted / first scheduled / first token / completed.
        attempt / status: attempt number (1-based) and its final status.
        error: message of a failed attempt.
    """

    op_id: str
    root_id: str
    stage_id: str = ""
    session_id: str = ""
    kind: OpKind
    role: str = ""
    iteration: int = 0
    round: int = 0
    deps: tuple[Dep, ...] = ()
    input_refs: tuple[str, ...] = ()
    output_ref: str | None = None
    output_token_ids_ref: str | None = None
    generation: GenerationSettings | None = None
    num_input_tokens: int = Field(default=0, ge=0)
    num_output_tokens: int = Field(default=0, ge=0)
    num_cached_tokens: int = Field(default=0, ge=0)
    prefix_block_hashes: tuple[int, ...] = ()
    block_size: int | None = None
    tool_name: str | None = None
    tool_duration_s: float | None = None
    external_delay_s: float = 0.0
    times: OpTimes = OpTimes()
    attempt: int = Field(default=1, ge=1)
    status: OpStatus = OpStatus.COMPLETED
    error: str | None = None


class RootRecord(_Record):
    """One root task instance (a workflow invocation or an imported request).

    `final_op_id` names the op whose output is the root's final artifact (the answer), when the
    run knows it. A k-of-n join leaves straggler ops that may finish after it: the root's latency
    ends at this op's completion, not at the last op's (`metrics.task`, the replay driver).
    None means "the op that completed last".
    """

    root_id: str
    workflow: str = ""
    workload_class: str = ""
    binding_instance: str = ""
    arrival_s: float = 0.0
    seed: int | None = None
    final_op_id: str | None = None


class StageRecord(_Record):
    """One stage instance of a root; `parent_stage_id` nests stages of compositions."""

    stage_id: str
    root_id: str
    name: str
    template: str = ""
    parent_stage_id: str | None = None
    iteration: int = 0


class SessionRecord(_Record):
    """A participant's conversation within a stage (its private history)."""

    session_id: str
    root_id: str
    stage_id: str = ""
    role: str = ""
    deployment: str = ""


class EngineSample(_Record):
    """One engine-state sample (vLLM Prometheus names where they exist)."""

    source: str
    t_s: float
    name: str
    value: float


class Manifest(_Record):
    """What a trace is: schema, workload and bindings, model stack, engine and seeds.

    `created_at` is kept in the ledger but left out of bundles so deterministic runs export
    byte-identical bundles.
    """

    schema_version: str = SCHEMA_VERSION
    trace_id: str
    source: str = "native"
    workload_spec: dict[str, Any] | None = None
    binding_ids: tuple[str, ...] = ()
    model: str = ""
    tokenizer: str = ""
    chat_template: str = ""
    engine: str = ""
    mode: str = ""
    seeds: dict[str, int] = Field(default_factory=dict)
    created_at: str | None = None
    notes: dict[str, Any] = Field(default_factory=dict)


class Trace(BaseModel):
    """A whole trace in memory: manifest, hierarchy, ops in record order, engine samples.

    Blobs live in a CAS; `Trace` only carries digests.
    """

    model_config = ConfigDict(extra="forbid")

    manifest: Manifest
    roots: list[RootRecord] = Field(default_factory=list)
    stages: list[StageRecord] = Field(default_factory=list)
    sessions: list[SessionRecord] = Field(default_factory=list)
    ops: list[OpRecord] = Field(default_factory=list)
    samples: list[EngineSample] = Field(default_factory=list)

    def op_index(self) -> dict[str, OpRecord]:
        """Map op id → record (last attempt wins when an op was retried)."""
        return {op.op_id: op for op in self.ops}

    def ops_of_root(self, root_id: str) -> list[OpRecord]:
        """Ops of one root in record order."""
        return [op for op in self.ops if op.root_id == root_id]
