"""OpenTelemetry export: span plans through the real SDK, the OTLP/JSON file, OTLP over HTTP.

Names and attribute keys are checked against `opentelemetry-semantic-conventions`; every op's
start / end times and token counts against the trace's; the JSON file and an OTLP/HTTP receiver
(a stdlib server decoding the protobuf with `opentelemetry-proto`) against the SDK's spans.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.semconv.attributes.service_attributes import SERVICE_NAME
from opentelemetry.trace import SpanKind, StatusCode
from typer.testing import CliRunner

from maserve_prefect.cli.trace_cmd import app
from maserve_prefect.errors import TraceExportError
from maserve_prefect.interop.otel_export import (
    build_spans,
    read_otlp_json,
    send_otlp,
    write_otlp_json,
)
from maserve_prefect.interop.otel_plan import otel_span_id, otel_trace_id, seconds_to_ns
from maserve_prefect.trace.bundle import export_bundle
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.model import (
    Dep,
    EdgeKind,
    GenerationSettings,
    Manifest,
    OpKind,
    OpRecord,
    OpStatus,
    OpTimes,
    RootRecord,
    SessionRecord,
    StageRecord,
    Trace,
)

OPS = gen_ai.GenAiOperationNameValues
EPOCH_NS = 1_764_662_400 * 10**9 + 7  # an odd nanosecond: the offset must be added, not rounded
TID = "t-otel"
runner = CliRunner()


def make_trace() -> Trace:
    """Two roots: nested stages, a session of two calls (one retried), a tool in a stage without
    a record, a state write read by the other root, a skipped op without times."""
    gen = GenerationSettings(deployment="main", max_tokens=64, temperature=0.7, seed=5)
    model = {
        "root_id": "a",
        "kind": OpKind.MODEL,
        "generation": gen,
        "role": "worker",
        "stage_id": "a/outer/inner",
        "session_id": "a/inner.w",
    }
    ops = [
        OpRecord(
            op_id="a/w/0",
            **model,
            num_input_tokens=100,
            num_output_tokens=50,
            num_cached_tokens=16,
            times=OpTimes(
                ready_s=0.25,
                submitted_s=0.3,
                first_scheduled_s=0.31,
                first_token_s=0.4123456789,
                completed_s=1.10000000066,
            ),
        ),
        OpRecord(
            op_id="a/w/1",
            **model,
            attempt=1,
            status=OpStatus.FAILED,
            error="engine closed",
            deps=(Dep(op_id="a/w/0", kind=EdgeKind.DATA),),
            num_input_tokens=120,
            times=OpTimes(submitted_s=1.2, completed_s=1.3),
        ),
        OpRecord(
            op_id="a/w/1",
            **model,
            attempt=2,
            deps=(Dep(op_id="a/w/0", kind=EdgeKind.DATA),),
            num_input_tokens=120,
            num_output_tokens=40,
            times=OpTimes(submitted_s=1.4, completed_s=2.000000001),
        ),
        OpRecord(
            op_id="a/tool/0",
            root_id="a",
            kind=OpKind.TOOL,
            stage_id="a/search",
            tool_name="web_search",
            tool_duration_s=0.5,
            deps=(Dep(op_id="a/w/1", kind=EdgeKind.DATA),),
            times=OpTimes(submitted_s=2.1, completed_s=2.6),
        ),
        OpRecord(
            op_id="a/mem/0",
            root_id="a",
            kind=OpKind.STATE_WRITE,
            stage_id="a/outer",
            deps=(Dep(op_id="a/tool/0", kind=EdgeKind.CONTROL),),
            times=OpTimes(submitted_s=2.6, completed_s=2.6),
        ),
        OpRecord(op_id="a/skip/0", root_id="a", kind=OpKind.MODEL, status=OpStatus.SKIPPED),
        OpRecord(
            op_id="b/read/0",
            root_id="b",
            kind=OpKind.STATE_READ,
            deps=(Dep(op_id="a/mem/0", kind=EdgeKind.STATE, required=False),),
            times=OpTimes(submitted_s=3.0, completed_s=3.0),
        ),
        OpRecord(
            op_id="b/m/0",
            root_id="b",
            kind=OpKind.MODEL,
            num_input_tokens=7,
            num_output_tokens=3,
            deps=(Dep(op_id="b/read/0", kind=EdgeKind.DATA),),
            times=OpTimes(submitted_s=3.1, first_token_s=3.2, completed_s=4.0),
        ),
    ]
    return Trace(
        manifest=Manifest(
            trace_id=TID,
            engine="sim",
            model="Qwen3-0.6B",
            notes={
                "pool": {"deployments": [{"name": "main", "model": "Qwen3-8B"}]},
                "replay": {"release_rule": "dag"},
            },
        ),
        roots=[
            RootRecord(root_id="a", workflow="wf", arrival_s=0.25),
            RootRecord(root_id="b", workflow="wf", arrival_s=1.0),
        ],
        stages=[
            StageRecord(stage_id="a/outer", root_id="a", name="outer", template="compose"),
            StageRecord(
                stage_id="a/outer/inner",
                root_id="a",
                name="inner",
                template="fork_join",
                parent_stage_id="a/outer",
            ),
        ],
        sessions=[
            SessionRecord(
                session_id="a/inner.w", root_id="a", stage_id="a/outer/inner", role="worker"
            )
        ],
        ops=ops,
    )


def op_spans(spans: list[ReadableSpan]) -> dict[tuple[str, int], ReadableSpan]:
    out = {}
    for s in spans:
        attrs = s.attributes or {}
        if "maserve.op_id" in attrs:
            out[(str(attrs["maserve.op_id"]), int(attrs["maserve.attempt"]))] = s  # type: ignore[arg-type]
    return out


def sid(root: str, key: str) -> int:
    return otel_span_id(TID, root, key)


def assert_op_matches(span: ReadableSpan, op: OpRecord, epoch_ns: int) -> None:
    """Span times are the op's times to the nanosecond; exact seconds and tokens ride along."""
    t = op.times
    start = t.submitted_s if t.submitted_s is not None else t.ready_s
    assert start is not None and t.completed_s is not None
    assert span.start_time == epoch_ns + seconds_to_ns(start)
    assert span.end_time == epoch_ns + seconds_to_ns(t.completed_s)
    for ns, sec in ((span.start_time, start), (span.end_time, t.completed_s)):
        assert abs(Fraction(ns - epoch_ns, 10**9) - Fraction(sec)) <= Fraction(1, 2 * 10**9)
    attrs = span.attributes or {}
    for name in ("ready_s", "submitted_s", "first_scheduled_s", "first_token_s", "completed_s"):
        if getattr(t, name) is not None:
            assert attrs[f"maserve.time.{name}"] == getattr(t, name)
    if op.kind is OpKind.MODEL:
        assert attrs[gen_ai.GEN_AI_USAGE_INPUT_TOKENS] == op.num_input_tokens
        assert attrs[gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS] == op.num_output_tokens
        assert attrs[gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == op.num_cached_tokens


def test_every_op_is_a_span_with_the_traces_times_tokens_and_genai_names() -> None:
    trace = make_trace()
    spans = build_spans(trace, epoch_ns=EPOCH_NS)
    by_op = op_spans(spans)
    assert len(by_op) == len(trace.ops)
    for op in trace.ops:
        if op.status is not OpStatus.SKIPPED:
            assert_op_matches(by_op[(op.op_id, op.attempt)], op, EPOCH_NS)

    chat = by_op[("a/w/0", 1)]
    assert chat.name == f"{OPS.CHAT.value} Qwen3-8B"
    assert chat.kind is SpanKind.CLIENT
    attrs = chat.attributes or {}
    assert attrs[gen_ai.GEN_AI_OPERATION_NAME] == OPS.CHAT.value
    assert attrs[gen_ai.GEN_AI_REQUEST_MODEL] == "Qwen3-8B"  # the deployment's model
    assert attrs[gen_ai.GEN_AI_PROVIDER_NAME] == attrs[gen_ai.GEN_AI_SYSTEM] == "maserve.sim"
    assert attrs[gen_ai.GEN_AI_REQUEST_MAX_TOKENS] == 64
    assert attrs[gen_ai.GEN_AI_REQUEST_TEMPERATURE] == 0.7
    assert attrs[gen_ai.GEN_AI_REQUEST_SEED] == 5
    assert attrs[gen_ai.GEN_AI_CONVERSATION_ID] == "a/inner.w"
    assert attrs[gen_ai.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] == 0.4123456789 - 0.3
    assert (attrs["maserve.stage"], attrs["maserve.template"]) == ("inner", "fork_join")
    assert attrs["maserve.release_rule"] == "dag"
    assert [(e.name, e.timestamp) for e in chat.events] == [
        ("maserve.ready", EPOCH_NS + seconds_to_ns(0.25)),
        ("maserve.first_scheduled", EPOCH_NS + seconds_to_ns(0.31)),
        ("maserve.first_token", EPOCH_NS + seconds_to_ns(0.4123456789)),
    ]

    tool = by_op[("a/tool/0", 1)]
    assert tool.name == f"{OPS.EXECUTE_TOOL.value} web_search"
    assert (tool.attributes or {})[gen_ai.GEN_AI_TOOL_NAME] == "web_search"
    assert (tool.attributes or {})[gen_ai.GEN_AI_OPERATION_NAME] == OPS.EXECUTE_TOOL.value
    assert by_op[("b/m/0", 1)].name == f"{OPS.CHAT.value} Qwen3-0.6B"  # the manifest's model

    failed = by_op[("a/w/1", 1)]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "engine closed"
    assert (failed.attributes or {})[ERROR_TYPE] == "failed"
    assert by_op[("a/w/1", 2)].status.status_code is StatusCode.UNSET
    skipped = by_op[("a/skip/0", 1)]  # never started: zero length at its root's arrival
    assert skipped.start_time == skipped.end_time == EPOCH_NS + seconds_to_ns(0.25)
    assert spans[0].resource.attributes[SERVICE_NAME] == "maserve"


def test_hierarchy_is_parent_child_and_intermediate_spans_cover_their_children() -> None:
    spans = build_spans(make_trace(), epoch_ns=EPOCH_NS)
    by_id = {s.context.span_id: s for s in spans if s.context is not None}
    by_op = op_spans(spans)

    def parent(span: ReadableSpan) -> ReadableSpan:
        assert span.parent is not None
        return by_id[span.parent.span_id]

    session = parent(by_op[("a/w/0", 1)])
    assert session.context is not None and session.context.span_id == sid("a", "session:a/inner.w")
    assert session.name == f"{OPS.INVOKE_AGENT.value} worker"
    assert (session.attributes or {})[gen_ai.GEN_AI_AGENT_NAME] == "worker"
    inner = parent(session)
    assert (inner.name, (inner.attributes or {})["maserve.template"]) == (
        "stage inner",
        "fork_join",
    )
    outer = parent(inner)
    assert outer.name == "stage outer" and parent(by_op[("a/mem/0", 1)]) is outer
    root = parent(outer)
    assert root.parent is None and root.name == f"{OPS.INVOKE_WORKFLOW.value} wf"
    assert (root.attributes or {})[gen_ai.GEN_AI_WORKFLOW_NAME] == "wf"
    synthesized = parent(by_op[("a/tool/0", 1)])  # stage a/search has no record
    assert (synthesized.name, (synthesized.attributes or {})["maserve.synthesized"]) == (
        "stage search",
        True,
    )
    assert parent(by_op[("a/skip/0", 1)]) is root

    # every intermediate span starts at its earliest child's start and ends at its latest end
    children: dict[int, list[ReadableSpan]] = {}
    for s in spans:
        if s.parent is not None:
            children.setdefault(s.parent.span_id, []).append(s)
    for span_id, kids in children.items():
        span = by_id[span_id]
        assert span.end_time == max(k.end_time or 0 for k in kids)
        if span.parent is not None:
            assert span.start_time == min(k.start_time or 0 for k in kids)
    assert root.start_time == EPOCH_NS + seconds_to_ns(0.25)  # the root's arrival
    assert root.end_time == EPOCH_NS + seconds_to_ns(2.6)
    # one OTel trace per root
    assert {s.context.trace_id for s in spans if s.context} == {
        otel_trace_id(TID, "a"),
        otel_trace_id(TID, "b"),
    }


def test_dependencies_are_typed_links_to_the_last_attempt_across_roots() -> None:
    spans = build_spans(make_trace(), epoch_ns=EPOCH_NS)
    by_op = op_spans(spans)

    def links(op_id: str, attempt: int = 1) -> list[tuple[int, int, dict[str, Any]]]:
        return [
            (lk.context.trace_id, lk.context.span_id, dict(lk.attributes or {}))
            for lk in by_op[(op_id, attempt)].links
        ]

    assert links("a/w/0") == []
    [(tid, span_id, attrs)] = links("a/tool/0")
    assert (tid, span_id) == (otel_trace_id(TID, "a"), sid("a", "op:a/w/1#2"))
    assert attrs == {
        "maserve.dependency.kind": "data",
        "maserve.dependency.op_id": "a/w/1",
        "maserve.dependency.required": True,
        "maserve.dependency.origin": "recorded",
    }
    [(_, _, control)] = links("a/mem/0")
    assert control["maserve.dependency.kind"] == "control"
    [(tid, span_id, state)] = links("b/read/0")  # persistent memory: the other root's trace
    assert (tid, span_id) == (otel_trace_id(TID, "a"), sid("a", "op:a/mem/0#1"))
    assert (state["maserve.dependency.kind"], state["maserve.dependency.required"]) == (
        "state",
        False,
    )
    targets = {(s.context.trace_id, s.context.span_id) for s in spans if s.context}
    assert all(
        (lk.context.trace_id, lk.context.span_id) in targets for s in spans for lk in s.links
    )


def test_ids_are_stable_across_exports_and_differ_between_traces() -> None:
    first = [
        (s.context.trace_id, s.context.span_id) for s in build_spans(make_trace()) if s.context
    ]
    again = [
        (s.context.trace_id, s.context.span_id) for s in build_spans(make_trace()) if s.context
    ]
    assert first == again and len(set(first)) == len(first)
    other = make_trace()
    other.manifest = other.manifest.model_copy(update={"trace_id": "another"})
    assert not {i for _, i in first} & {s.context.span_id for s in build_spans(other) if s.context}


def any_value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(any_value(x) for x in v.array_value.values)
    return getattr(v, kind)


def assert_proto_equals_sdk(proto: list[ProtoSpan], sdk: list[ReadableSpan]) -> None:
    assert len(proto) == len(sdk)
    for p, s in zip(proto, sdk, strict=True):
        assert s.context is not None
        assert (p.name, p.start_time_unix_nano, p.end_time_unix_nano) == (
            s.name,
            s.start_time,
            s.end_time,
        )
        assert p.trace_id == s.context.trace_id.to_bytes(16, "big")
        assert p.span_id == s.context.span_id.to_bytes(8, "big")
        assert p.parent_span_id == (s.parent.span_id.to_bytes(8, "big") if s.parent else b"")
        assert {a.key: any_value(a.value) for a in p.attributes} == dict(s.attributes or {})
        assert [
            (lk.span_id, {a.key: any_value(a.value) for a in lk.attributes}) for lk in p.links
        ] == [(lk.context.span_id.to_bytes(8, "big"), dict(lk.attributes or {})) for lk in s.links]
        assert p.status.code == s.status.status_code.value


def proto_spans(requests: list[ExportTraceServiceRequest]) -> list[ProtoSpan]:
    return [
        sp for r in requests for rs in r.resource_spans for ss in rs.scope_spans for sp in ss.spans
    ]


def test_json_file_is_otlp_json_and_reads_back_as_the_sdks_spans(tmp_path: Path) -> None:
    trace, dest = make_trace(), tmp_path / "t.otlp.json"
    assert write_otlp_json(trace, dest, epoch_ns=EPOCH_NS) == len(build_spans(trace))
    lines = dest.read_text().splitlines()
    assert len(lines) == 2  # one ExportTraceServiceRequest per root
    raw = json.loads(lines[0])["resourceSpans"][0]
    first = raw["scopeSpans"][0]["spans"][0]
    assert first["traceId"] == f"{otel_trace_id(TID, 'a'):032x}"  # hex, not base64
    assert first["spanId"] == f"{sid('a', 'root'):016x}" and first["kind"] == 1
    assert {"key": "service.name", "value": {"stringValue": "maserve"}} in raw["resource"][
        "attributes"
    ]
    requests = read_otlp_json(dest)
    assert_proto_equals_sdk(proto_spans(requests), build_spans(trace, epoch_ns=EPOCH_NS))
    dest.write_text("old\n")
    with pytest.raises(TraceExportError, match="already exists"):
        write_otlp_json(trace, dest)
    assert dest.read_text() == "old\n"
    write_otlp_json(trace, dest, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.otlp.json"]  # no temp file left


class Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver: /v1/traces takes protobuf requests; any other path is a 404."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        server: Any = self.server
        server.received.append(
            (self.path, self.headers["Content-Type"], ExportTraceServiceRequest.FromString(body))
        )
        payload = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200 if self.path == "/v1/traces" else 404)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def receiver() -> Iterator[Any]:
    server: Any = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    server.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_endpoint_receives_the_spans_as_otlp_protobuf_on_v1_traces() -> None:
    trace = make_trace()
    spans = build_spans(trace, epoch_ns=EPOCH_NS)
    with receiver() as server:
        assert send_otlp(spans, f"http://127.0.0.1:{server.server_port}") == 1
    [(path, content_type, request)] = server.received
    assert (path, content_type) == ("/v1/traces", "application/x-protobuf")
    assert_proto_equals_sdk(proto_spans([request]), spans)


def test_endpoint_that_refuses_is_one_line_naming_it() -> None:
    spans = build_spans(make_trace())
    with receiver() as server:
        url = f"http://127.0.0.1:{server.server_port}/wrong/path"
        with pytest.raises(TraceExportError) as refused:
            send_otlp(spans, url, timeout_s=2)
    assert url in str(refused.value) and "HTTP 404" in str(refused.value)
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(TraceExportError) as unreachable:
        send_otlp(spans, f"http://127.0.0.1:{port}", timeout_s=1)
    message = str(unreachable.value)
    assert f"http://127.0.0.1:{port}/v1/traces" in message and "\n" not in message
    assert "connection refused" in message


def test_cli_writes_the_file_and_refuses_a_bad_endpoint_in_one_line(tmp_path: Path) -> None:
    trace = Trace(
        manifest=Manifest(trace_id="cli"),
        roots=[RootRecord(root_id="r")],
        ops=[
            OpRecord(
                op_id="r/0",
                root_id="r",
                kind=OpKind.TOOL,
                tool_name="grep",
                times=OpTimes(submitted_s=0.5, completed_s=1.0),
            )
        ],
    )
    bundle = export_bundle(trace, MemoryStore(), tmp_path / "b")
    dest = tmp_path / "out" / "t.json"
    args = ["export", "--bundle", str(bundle), "--epoch", "2026-12-02T00:00:00Z"]
    result = runner.invoke(app, [*args, "--otel", str(dest)])
    assert result.exit_code == 0, result.output
    assert "2 spans in 1 OTel trace(s)" in result.output
    [span] = [s for s in proto_spans(read_otlp_json(dest)) if s.name == "execute_tool grep"]
    midnight = int(datetime(2026, 12, 2, tzinfo=UTC).timestamp())
    assert span.start_time_unix_nano == midnight * 10**9 + 500_000_000
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = runner.invoke(
        app, [*args, "--otlp-endpoint", f"http://127.0.0.1:{port}", "--otlp-timeout", "1"]
    )
    assert result.exit_code == 1
    assert f"OTLP endpoint http://127.0.0.1:{port}/v1/traces" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(app, [*args, "--otel", str(dest)])  # exists: refused, left as it was
    assert result.exit_code == 1 and "already exists" in result.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "give exactly one of --run TRACE_ID or --bundle DIR"),
        (["--run", "x", "--bundle", "b"], "give exactly one of --run TRACE_ID or --bundle DIR"),
        (["--flow-run", "f"], "export a whole run: give --run TRACE_ID"),
        (["--bundle", "b", "--out", "o"], "no bundle is written"),
        (["--bundle", "b", "--otlp-endpoint", "localhost:4318"], "give an http(s) URL"),
        (["--bundle", "b", "--epoch", "yesterday"], "--epoch 'yesterday': give Unix seconds"),
    ],
)
def test_cli_misuse_is_one_line_and_writes_nothing(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    trace = Trace(manifest=Manifest(trace_id="m"), roots=[RootRecord(root_id="r")])
    export_bundle(trace, MemoryStore(), tmp_path / "b")
    args = [a if a not in ("b", "o") else str(tmp_path / a) for a in extra]
    dest = tmp_path / "t.json"
    if "--otlp-endpoint" not in args:
        args += ["--otel", str(dest)]
    result = runner.invoke(app, ["export", *args])
    assert result.exit_code == 1
    assert message in result.output and "Traceback" not in result.output
    assert not dest.exists() and not (tmp_path / "o").exists()


def test_a_looping_stage_chain_is_refused_by_name() -> None:
    from maserve_prefect.errors import TraceValidationError
    from maserve_prefect.interop.otel_plan import plan_trace

    trace = Trace(
        manifest=Manifest(trace_id="loop"),
        stages=[
            StageRecord(stage_id="r/x", root_id="r", name="x", parent_stage_id="r/y"),
            StageRecord(stage_id="r/y", root_id="r", name="y", parent_stage_id="r/x"),
        ],
        ops=[OpRecord(op_id="r/x/0", root_id="r", kind=OpKind.TRANSFORM, stage_id="r/x")],
    )
    with pytest.raises(TraceValidationError, match=r"stage 'r/x' of root 'r'.*loops"):
        plan_trace(trace)
