"""A real recorded run (code_repair on the simulator, through Prefect) exported as OTel spans.

`maserve trace export --run ID --otel FILE` reads the ledger's record; the file must hold one
span per op with the op's times, token counts and Prefect task-run id, tools as spans of their
own and every dependency as a link — the same spans the SDK's in-memory exporter records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from typer.testing import CliRunner

from maserve_prefect.cli.trace_cmd import app
from maserve_prefect.interop.otel_export import build_spans, read_otlp_json
from maserve_prefect.interop.otel_plan import resolve_epoch_ns, seconds_to_ns
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import OpKind

pytestmark = pytest.mark.usefixtures("prefect_api")
runner = CliRunner()


def attrs(span: ProtoSpan) -> dict[str, Any]:
    return {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}


def test_recorded_run_exports_every_op_with_its_times_tokens_and_prefect_ids(
    tmp_path: Path,
) -> None:
    from maserve_prefect.flows.native import run_native

    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    with Ledger(db, MemoryStore()) as ledger:
        tid = run_native("code_repair", users=1, seed=0, ledger=ledger).trace.manifest.trace_id
        trace = ledger.load_trace(tid)
        links = ledger.prefect_links(tid)
    dest = tmp_path / "run.otlp.json"
    result = runner.invoke(app, ["export", "--run", tid, "--ledger", db, "--otel", str(dest)])
    assert result.exit_code == 0, result.output

    spans = [
        s
        for r in read_otlp_json(dest)
        for rs in r.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    ]
    by_op = {attrs(s)["maserve.op_id"]: s for s in spans if "maserve.op_id" in attrs(s)}
    assert trace.manifest.created_at is not None  # the ledger keeps it: t = 0 is placed there
    epoch_ns = resolve_epoch_ns(None, trace.manifest.created_at, 0)
    task_runs = {lk.op_id: lk.task_run_id for lk in links}
    kinds = {op.kind for op in trace.ops}
    assert {OpKind.MODEL, OpKind.TOOL} <= kinds and len(by_op) == len(trace.ops)
    for op in trace.ops:
        span, a = by_op[op.op_id], attrs(by_op[op.op_id])
        assert op.times.submitted_s is not None and op.times.completed_s is not None
        assert span.start_time_unix_nano == epoch_ns + seconds_to_ns(op.times.submitted_s)
        assert span.end_time_unix_nano == epoch_ns + seconds_to_ns(op.times.completed_s)
        assert a["maserve.time.completed_s"] == op.times.completed_s
        assert a["maserve.prefect.task_run_id"] == task_runs[op.op_id]
        assert len(span.links) == len(op.deps)
        if op.kind is OpKind.MODEL:
            assert span.name.startswith(gen_ai.GenAiOperationNameValues.CHAT.value + " ")
            assert a[gen_ai.GEN_AI_USAGE_INPUT_TOKENS] == op.num_input_tokens
            assert a[gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS] == op.num_output_tokens
        else:
            assert a[gen_ai.GEN_AI_OPERATION_NAME] == "execute_tool"
            assert a[gen_ai.GEN_AI_TOOL_NAME] == op.tool_name == "run_tests"
    root = next(s for s in spans if not s.parent_span_id)
    assert attrs(root)["maserve.prefect.flow_run_id"] == links[0].flow_run_id

    # the file holds what the SDK's in-memory exporter recorded, span for span
    sdk = build_spans(trace, epoch_ns=epoch_ns, prefect_links=links)
    assert [(s.name, s.start_time_unix_nano, s.end_time_unix_nano, s.span_id) for s in spans] == [
        (s.name, s.start_time, s.end_time, s.context.span_id.to_bytes(8, "big"))
        for s in sdk
        if s.context is not None
    ]
