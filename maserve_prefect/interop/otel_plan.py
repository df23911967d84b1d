"""A Semantic Trace planned as OpenTelemetry spans: ids, parents, times, links and attributes.

The one idea: **every span is a pure function of the trace.** Ids are hashes of the trace id,
the root id and the record's id; times are the trace's own timestamps placed on Unix time; so a
re-export gives the same spans, ids included. `otel_export` turns these plans into the SDK's spans
and writes them; nothing here imports the SDK.

One OTel trace per root, its spans nested as the trace's hierarchical ids are:

    invoke_workflow <workflow>        the root (RootRecord)
      stage <name>                    a stage instance, nested by parent_stage_id
        invoke_agent <role>           a session: one participant's conversation
          chat <model>                a model op (span kind CLIENT)
          execute_tool <tool>         a tool op
          <kind> <role>               a transform, state_read or state_write op

An op without a session hangs under its stage, one without a stage under the root. A stage or
session that ops name but the trace has no record of is synthesized from the ids. An
intermediate span starts at the earliest start and ends at the latest end of its children; a
root span starts no later than its root's arrival. Each attempt of a retried op is a span;
dependencies link to the op's last attempt, in whichever root's trace it is (persistent memory).

Time: the trace stores seconds on the run's own clock (virtual seconds on the simulator; seconds
since the run's start on a monotonic wall clock on a real engine), not Unix time. A span time is
`epoch_ns + round(t_s * 10**9)`, rounded exactly from the binary float, where `epoch_ns` is the
Unix time the run's t = 0 is placed at (`resolve_epoch_ns`). An op starts at `submitted_s` (else
its earliest recorded time) and ends at `completed_s` (else its latest); one with no time at all
(skipped) is a zero-length span at its root's arrival. The exact float seconds ride along as
`maserve.time.*` attributes, so nothing is lost to the rounding.

Examples:
    >>> from maserve_prefect.trace.model import (
    ...     Manifest, OpKind, OpRecord, OpTimes, RootRecord, Trace)
    >>> t = Trace(manifest=Manifest(trace_id="t"), roots=[RootRecord(root_id="r", arrival_s=1.0)],
    ...           ops=[OpRecord(op_id="r/op0", root_id="r", kind=OpKind.MODEL,
    ...                         times=OpTimes(submitted_s=1.5, completed_s=2.0))])
    >>> [(s.name, s.start_ns, s.end_ns) for s in plan_trace(t)[0].spans]
    [('invoke_workflow', 1000000000, 2000000000), ('chat', 1500000000, 2000000000)]
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any, Literal

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.semconv.attributes.service_attributes import SERVICE_NAME

from maserve_prefect.errors import ConfigError, TraceValidationError
from maserve_prefect.trace.model import (
    OpKind,
    OpRecord,
    OpStatus,
    RootRecord,
    SessionRecord,
    StageRecord,
    Trace,
)
from maserve_prefect.trace.runs import PrefectLink

AttrValue = str | bool | int | float | tuple[str, ...]
SpanKindName = Literal["internal", "client"]

SERVICE = "maserve"
NS_PER_S = 10**9
SIM_PROVIDER = "maserve.sim"
OPENAI_PROVIDER = "openai"
OP_TIMES = ("ready_s", "submitted_s", "first_scheduled_s", "first_token_s", "completed_s")
"""`OpTimes` fields, in the order they happen."""


@dataclass(frozen=True, slots=True)
class LinkPlan:
    """A link to another span (a dependency), by its ids."""

    trace_id: int
    span_id: int
    attributes: dict[str, AttrValue]


@dataclass(frozen=True, slots=True)
class EventPlan:
    """A timed event within a span (first token, first scheduled, ready)."""

    name: str
    time_ns: int


@dataclass(slots=True)
class SpanPlan:
    """One span, everything the SDK needs to build it.

    Attributes:
        key: what the span stands for within its root: `root`, `stage:<id>`, `session:<id>` or
            `op:<op id>#<attempt>`.
        parent_span_id: None for the root span.
        error: the status description when the span's status is ERROR (a failed op).
    """

    key: str
    name: str
    trace_id: int
    span_id: int
    parent_span_id: int | None
    start_ns: int
    end_ns: int
    kind: SpanKindName = "internal"
    attributes: dict[str, AttrValue] = field(default_factory=dict)
    links: tuple[LinkPlan, ...] = ()
    events: tuple[EventPlan, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class TracePlan:
    """One root as one OTel trace: its spans, root span first, parents before children."""

    root_id: str
    trace_id: int
    spans: tuple[SpanPlan, ...]


def otel_trace_id(trace_id: str, root_id: str) -> int:
    """The OTel trace id (128 bits) of one root of a trace: the first 16 bytes of a SHA-256.

    Examples:
        >>> f"{otel_trace_id('t', 'r'):032x}" == f"{otel_trace_id('t', 'r'):032x}"
        True
    """
    return _hash_id(f"maserve-trace\0{trace_id}\0{root_id}", 16)


def otel_span_id(trace_id: str, root_id: str, key: str) -> int:
    """The OTel span id (64 bits) of the span `key` (see `SpanPlan.key`) of a root."""
    return _hash_id(f"maserve-span\0{trace_id}\0{root_id}\0{key}", 8)


def op_key(op: OpRecord) -> str:
    """`SpanPlan.key` of one attempt of an op."""
    return f"op:{op.op_id}#{op.attempt}"


def seconds_to_ns(t_s: float) -> int:
    """Seconds → integer nanoseconds, rounded (half to even) from the float's exact value.

    Examples:
        >>> seconds_to_ns(0.1), seconds_to_ns(45.7683072)
        (100000000, 45768307200)
    """
    return round(Fraction(t_s) * NS_PER_S)


def resolve_epoch_ns(spec: str | None, created_at: str | None, now_ns: int) -> int:
    """The Unix time (ns) a trace's t = 0 is placed at.

    Args:
        spec: Unix seconds ("1764662400.5"), an ISO 8601 time ("2026-12-02T08:00:00Z"; no zone
            means UTC) or "now"; None takes `created_at`, else 0 (1970-01-01T00:00:00Z).
        created_at: the manifest's creation time (kept in the ledger, left out of bundles).
        now_ns: the current Unix time in ns, for "now".

    Raises:
        ConfigError: `spec` is none of these.

    Examples:
        >>> resolve_epoch_ns("1.5", None, 0), resolve_epoch_ns(None, None, 0)
        (1500000000, 0)
        >>> resolve_epoch_ns("1970-01-01T00:00:02Z", None, 0)
        2000000000
    """
    if spec is None:
        return _iso_ns(created_at, "the manifest's created_at") if created_at else 0
    if spec == "now":
        return now_ns
    try:
        return seconds_to_ns(float(spec))
    except ValueError:
        return _iso_ns(spec, "--epoch")


def resource_attributes(trace: Trace) -> dict[str, AttrValue]:
    """The resource every span of `trace` carries: the service and what the trace is."""
    m = trace.manifest
    attrs: dict[str, AttrValue] = {
        SERVICE_NAME: SERVICE,
        "maserve.trace_id": m.trace_id,
        "maserve.source": m.source,
        "maserve.schema_version": m.schema_version,
    }
    optional: dict[str, AttrValue] = {
        "maserve.engine": m.engine,
        "maserve.mode": m.mode,
        "maserve.model": m.model,
        "maserve.binding_ids": tuple(m.binding_ids),
        "maserve.release_rule": _release_rule(trace) or "",
    }
    attrs.update({k: v for k, v in optional.items() if v})
    return attrs


def plan_trace(
    trace: Trace, *, epoch_ns: int = 0, prefect_links: Iterable[PrefectLink] = ()
) -> list[TracePlan]:
    """Plan every root of `trace` as one OTel trace (roots in record order).

    Args:
        trace: the trace (its deps must name ops of the trace: `validate_trace`).
        epoch_ns: the Unix time (ns) of the run's t = 0 (`resolve_epoch_ns`).
        prefect_links: the ledger's Prefect task / flow-run ids of ops, where recorded.

    Raises:
        TraceValidationError: a stage's parent chain loops.
    """
    ctx = _Context.of(trace, epoch_ns, prefect_links)
    by_root: dict[str, list[OpRecord]] = defaultdict(list)
    for op in trace.ops:
        by_root[op.root_id].append(op)
    roots = {r.root_id: r for r in trace.roots}
    order = list(dict.fromkeys([*roots, *by_root]))
    return [
        _plan_root(ctx, roots.get(rid, RootRecord(root_id=rid)), by_root.get(rid, []))
        for rid in order
    ]


# ---- one root -----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Context:
    """What every root's plan reads: the trace's indexes."""

    trace: Trace
    epoch_ns: int
    links: dict[tuple[str, int], PrefectLink]
    last_attempt: dict[str, OpRecord]
    stages: dict[str, StageRecord]
    sessions: dict[str, SessionRecord]
    models: dict[str, str]
    provider: str | None
    release_rule: str | None

    @classmethod
    def of(cls, trace: Trace, epoch_ns: int, links: Iterable[PrefectLink]) -> _Context:
        return cls(
            trace=trace,
            epoch_ns=epoch_ns,
            links={(link.op_id, link.attempt): link for link in links},
            last_attempt=trace.op_index(),
            stages={s.stage_id: s for s in trace.stages},
            sessions={s.session_id: s for s in trace.sessions},
            models=_deployment_models(trace.manifest.notes),
            provider=_provider(trace.manifest.engine),
            release_rule=_release_rule(trace),
        )

    def ns(self, t_s: float) -> int:
        return self.epoch_ns + seconds_to_ns(t_s)


def _plan_root(ctx: _Context, root: RootRecord, ops: Sequence[OpRecord]) -> TracePlan:
    tid_str = ctx.trace.manifest.trace_id
    trace_id = otel_trace_id(tid_str, root.root_id)

    def span_id(key: str) -> int:
        return otel_span_id(tid_str, root.root_id, key)

    stages = ctx.stages
    sessions = ctx.sessions
    parent_of: dict[str, str] = {}  # span key → parent span key

    def stage_key(stage_id: str) -> str:
        chain: list[str] = []
        key = f"stage:{stage_id}"
        while key != "root":
            if key in chain:
                raise TraceValidationError(
                    f"stage {stage_id!r} of root {root.root_id!r}: its parent_stage_id chain "
                    "loops; fix the stage records"
                )
            if key in parent_of:
                break  # resolved before, and acyclic
            chain.append(key)
            rec = stages.get(key.removeprefix("stage:"))
            parent = rec.parent_stage_id if rec is not None else None
            parent_of[key] = f"stage:{parent}" if parent else "root"
            key = parent_of[key]
        return f"stage:{stage_id}"

    def session_key(op: OpRecord) -> str:
        key = f"session:{op.session_id}"
        if key not in parent_of:
            rec = sessions.get(op.session_id)
            stage_id = rec.stage_id if rec is not None and rec.stage_id else op.stage_id
            parent_of[key] = stage_key(stage_id) if stage_id else "root"
        return key

    arrival_ns = ctx.ns(root.arrival_s)
    spans: dict[str, SpanPlan] = {}
    for op in ops:
        parent = (
            session_key(op) if op.session_id else stage_key(op.stage_id) if op.stage_id else "root"
        )
        spans[op_key(op)] = _op_span(
            ctx, op, trace_id, span_id(op_key(op)), span_id(parent), arrival_ns
        )
        parent_of[op_key(op)] = parent

    # Intermediate spans cover their children: widen every ancestor of every op span.
    bounds: dict[str, tuple[int, int]] = {"root": (arrival_ns, arrival_ns)}
    for key, span in spans.items():
        node = parent_of[key]
        while True:
            lo, hi = bounds.get(node, (span.start_ns, span.end_ns))
            bounds[node] = (min(lo, span.start_ns), max(hi, span.end_ns))
            if node == "root":
                break
            node = parent_of[node]
    for key in bounds:
        spans[key] = _intermediate_span(
            ctx, root, key, stages, sessions, ops, trace_id, span_id, parent_of, bounds[key]
        )
    return TracePlan(root.root_id, trace_id, tuple(_preorder(spans, parent_of)))


def _preorder(spans: Mapping[str, SpanPlan], parent_of: Mapping[str, str]) -> list[SpanPlan]:
    """Root first, then each span's children by start time (ties by key)."""
    children: dict[str, list[str]] = defaultdict(list)
    for key in spans:
        if key != "root":
            children[parent_of[key]].append(key)
    out: list[SpanPlan] = []
    stack = ["root"]
    while stack:
        key = stack.pop()
        out.append(spans[key])
        stack.extend(sorted(children[key], key=lambda k: (spans[k].start_ns, k), reverse=True))
    return out


def _intermediate_span(
    ctx: _Context,
    root: RootRecord,
    key: str,
    stages: Mapping[str, StageRecord],
    sessions: Mapping[str, SessionRecord],
    ops: Sequence[OpRecord],
    trace_id: int,
    span_id: Callable[[str], int],
    parent_of: Mapping[str, str],
    bounds: tuple[int, int],
) -> SpanPlan:
    kind, _, ident = key.partition(":")
    attrs: dict[str, AttrValue] = {"maserve.root_id": root.root_id}
    if kind == "root":
        name = f"invoke_workflow {root.workflow}".strip()
        attrs |= _root_attributes(ctx, root, ops)
    elif kind == "stage":
        rec = stages.get(ident)
        stage_name = rec.name if rec is not None else ident.rpartition("/")[2]
        name = f"stage {stage_name}"
        attrs |= {
            "maserve.stage_id": ident,
            "maserve.stage": stage_name,
            "maserve.synthesized": rec is None,
        }
        if rec is not None:
            attrs |= {"maserve.iteration": rec.iteration}
            if rec.template:
                attrs["maserve.template"] = rec.template
    else:
        sess = sessions.get(ident)
        role = sess.role if sess is not None and sess.role else _session_role(ident, ops)
        name = f"invoke_agent {role}".strip()
        attrs |= {
            gen_ai.GEN_AI_OPERATION_NAME: gen_ai.GenAiOperationNameValues.INVOKE_AGENT.value,
            gen_ai.GEN_AI_AGENT_ID: ident,
            gen_ai.GEN_AI_CONVERSATION_ID: ident,
            "maserve.session_id": ident,
            "maserve.synthesized": sess is None,
        }
        if role:
            attrs[gen_ai.GEN_AI_AGENT_NAME] = role
    return SpanPlan(
        key=key,
        name=name,
        trace_id=trace_id,
        span_id=span_id(key),
        parent_span_id=None if kind == "root" else span_id(parent_of[key]),
        start_ns=bounds[0],
        end_ns=bounds[1],
        attributes=attrs,
    )


def _root_attributes(
    ctx: _Context, root: RootRecord, ops: Sequence[OpRecord]
) -> dict[str, AttrValue]:
    attrs: dict[str, AttrValue] = {
        gen_ai.GEN_AI_OPERATION_NAME: gen_ai.GenAiOperationNameValues.INVOKE_WORKFLOW.value,
        "maserve.trace_id": ctx.trace.manifest.trace_id,
        "maserve.time.arrival_s": root.arrival_s,
    }
    optional: dict[str, AttrValue | None] = {
        gen_ai.GEN_AI_WORKFLOW_NAME: root.workflow or None,
        "maserve.workflow": root.workflow or None,
        "maserve.workload_class": root.workload_class or None,
        "maserve.binding_instance": root.binding_instance or None,
        "maserve.final_op_id": root.final_op_id,
        "maserve.seed": root.seed,
        "maserve.release_rule": ctx.release_rule,
        "maserve.prefect.flow_run_id": _root_flow_run(ctx, ops),
    }
    attrs.update({k: v for k, v in optional.items() if v is not None})
    return attrs


def _root_flow_run(ctx: _Context, ops: Sequence[OpRecord]) -> str | None:
    """The Prefect flow run of a root: the one its ops' task runs ran in."""
    for op in ops:
        link = ctx.links.get((op.op_id, op.attempt))
        if link is not None and link.flow_run_id:
            return link.flow_run_id
    return None


def _op_span(
    ctx: _Context, op: OpRecord, trace_id: int, span_id: int, parent_id: int, arrival_ns: int
) -> SpanPlan:
    times = {name: t for name in OP_TIMES if (t := getattr(op.times, name)) is not None}
    if times:
        start_s = times.get("submitted_s", min(times.values()))
        end_s = times.get("completed_s", max(times.values()))
        start_ns, end_ns = ctx.ns(start_s), ctx.ns(max(end_s, start_s))
    else:
        start_ns = end_ns = arrival_ns
    attrs = _op_attributes(ctx, op, times)
    if op.kind is OpKind.MODEL:
        model = ctx.models.get(op.generation.deployment) if op.generation else None
        model = model or ctx.trace.manifest.model or None
        name, kind = f"chat {model or ''}".strip(), "client"
        attrs |= _model_attributes(ctx, op, model, times)
    elif op.kind is OpKind.TOOL:
        name, kind = f"execute_tool {op.tool_name or ''}".strip(), "internal"
        attrs[gen_ai.GEN_AI_OPERATION_NAME] = gen_ai.GenAiOperationNameValues.EXECUTE_TOOL.value
        if op.tool_name:
            attrs[gen_ai.GEN_AI_TOOL_NAME] = op.tool_name
        if op.tool_duration_s is not None:
            attrs["maserve.tool_duration_s"] = op.tool_duration_s
    else:
        name, kind = f"{op.kind.value} {op.role}".strip(), "internal"
    if op.kind is not OpKind.MODEL:
        if op.num_input_tokens:
            attrs["maserve.usage.input_tokens"] = op.num_input_tokens
        if op.num_output_tokens:
            attrs["maserve.usage.output_tokens"] = op.num_output_tokens
    events = tuple(
        EventPlan(f"maserve.{name.removesuffix('_s')}", ctx.ns(t))
        for name, t in times.items()
        if name in ("ready_s", "first_scheduled_s", "first_token_s") and ctx.ns(t) != start_ns
    )
    failed = op.status in (OpStatus.FAILED, OpStatus.INCOMPLETE)
    if failed:
        attrs[ERROR_TYPE] = op.status.value
    return SpanPlan(
        key=op_key(op),
        name=name,
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent_id,
        start_ns=start_ns,
        end_ns=end_ns,
        kind=kind,  # type: ignore[arg-type]
        attributes=attrs,
        links=tuple(_dep_links(ctx, op)),
        events=events,
        error=(op.error or op.status.value) if failed else None,
    )


def _op_attributes(ctx: _Context, op: OpRecord, times: Mapping[str, float]) -> dict[str, AttrValue]:
    attrs: dict[str, AttrValue] = {
        "maserve.op_id": op.op_id,
        "maserve.op.kind": op.kind.value,
        "maserve.root_id": op.root_id,
        "maserve.attempt": op.attempt,
        "maserve.status": op.status.value,
        "maserve.iteration": op.iteration,
        "maserve.round": op.round,
    }
    attrs.update({f"maserve.time.{name}": t for name, t in times.items()})
    stage = ctx.stages.get(op.stage_id)
    optional: dict[str, AttrValue | None] = {
        "maserve.stage_id": op.stage_id or None,
        "maserve.stage": stage.name if stage is not None else None,
        "maserve.template": stage.template if stage is not None and stage.template else None,
        "maserve.session_id": op.session_id or None,
        "maserve.role": op.role or None,
        "maserve.release_rule": ctx.release_rule,
        "maserve.external_delay_s": op.external_delay_s or None,
        "maserve.error": op.error,
    }
    link = ctx.links.get((op.op_id, op.attempt))
    if link is not None:
        optional["maserve.prefect.task_run_id"] = link.task_run_id
        optional["maserve.prefect.flow_run_id"] = link.flow_run_id
    attrs.update({k: v for k, v in optional.items() if v is not None})
    return attrs


def _model_attributes(
    ctx: _Context, op: OpRecord, model: str | None, times: Mapping[str, float]
) -> dict[str, AttrValue]:
    gen = op.generation
    attrs: dict[str, AttrValue] = {
        gen_ai.GEN_AI_OPERATION_NAME: gen_ai.GenAiOperationNameValues.CHAT.value,
        gen_ai.GEN_AI_USAGE_INPUT_TOKENS: op.num_input_tokens,
        gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: op.num_output_tokens,
        gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: op.num_cached_tokens,
    }
    optional: dict[str, AttrValue | None] = {
        gen_ai.GEN_AI_REQUEST_MODEL: model,
        gen_ai.GEN_AI_PROVIDER_NAME: ctx.provider,
        gen_ai.GEN_AI_SYSTEM: ctx.provider,
        gen_ai.GEN_AI_CONVERSATION_ID: op.session_id or None,
        gen_ai.GEN_AI_REQUEST_MAX_TOKENS: gen.max_tokens if gen else None,
        gen_ai.GEN_AI_REQUEST_TEMPERATURE: gen.temperature if gen else None,
        gen_ai.GEN_AI_REQUEST_SEED: gen.seed if gen else None,
        "maserve.deployment": gen.deployment or None if gen else None,
        "maserve.priority": gen.priority or None if gen else None,
    }
    if "first_token_s" in times and "submitted_s" in times:
        optional[gen_ai.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = (
            times["first_token_s"] - times["submitted_s"]
        )
    if op.prefix_block_hashes:
        optional["maserve.num_prefix_blocks"] = len(op.prefix_block_hashes)
        optional["maserve.block_size"] = op.block_size
    attrs.update({k: v for k, v in optional.items() if v is not None})
    return attrs


def _dep_links(ctx: _Context, op: OpRecord) -> Iterable[LinkPlan]:
    tid = ctx.trace.manifest.trace_id
    for dep in op.deps:
        target = ctx.last_attempt.get(dep.op_id)
        if target is None:
            continue  # validate_trace refuses such a trace; a partial export leaves it out
        attrs: dict[str, AttrValue] = {
            "maserve.dependency.kind": dep.kind.value,
            "maserve.dependency.op_id": dep.op_id,
            "maserve.dependency.required": dep.required,
            "maserve.dependency.origin": dep.origin.value,
        }
        if dep.stage is not None:
            attrs["maserve.dependency.stage"] = dep.stage
        yield LinkPlan(
            trace_id=otel_trace_id(tid, target.root_id),
            span_id=otel_span_id(tid, target.root_id, op_key(target)),
            attributes=attrs,
        )


# ---- helpers ------------------------------------------------------------------------------------


def _hash_id(text: str, num_bytes: int) -> int:
    value = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:num_bytes], "big")
    return value or 1  # an all-zero id is invalid in OTel


def _iso_ns(text: str, what: str) -> int:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"{what} {text!r}: give Unix seconds (1764662400), an ISO 8601 time "
            "(2026-12-02T08:00:00Z) or 'now'"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    delta = when - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * NS_PER_S + delta.microseconds * 1000


def _deployment_models(notes: Mapping[str, Any]) -> dict[str, str]:
    """Deployment name → model name, from the pool the run recorded in its manifest notes."""
    pool = notes.get("pool")
    deployments = pool.get("deployments") if isinstance(pool, dict) else None
    if not isinstance(deployments, list):
        return {}
    return {
        str(d["name"]): str(d["model"])
        for d in deployments
        if isinstance(d, dict) and d.get("name") and d.get("model")
    }


def _provider(engine: str) -> str | None:
    """`gen_ai.provider.name`: the simulator, or the OpenAI-compatible API a real engine spoke."""
    if engine == "sim":
        return SIM_PROVIDER
    if engine.startswith(("openai", "fleet", "vllm")):
        return OPENAI_PROVIDER
    return None


def _release_rule(trace: Trace) -> str | None:
    replay = trace.manifest.notes.get("replay")
    rule = replay.get("release_rule") if isinstance(replay, dict) else None
    return str(rule) if rule else None


def _session_role(session_id: str, ops: Sequence[OpRecord]) -> str:
    return next((op.role for op in ops if op.session_id == session_id and op.role), "")


__all__ = [
    "EventPlan",
    "LinkPlan",
    "SpanPlan",
    "TracePlan",
    "op_key",
    "otel_span_id",
    "otel_trace_id",
    "plan_trace",
    "resolve_epoch_ns",
    "resource_attributes",
    "seconds_to_ns",
]
