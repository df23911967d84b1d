"""The engine's client as a load generator's: warm pooled connections, TTFT from the send."""

from __future__ import annotations

from openai_stub import StubConfig, serve

from maserve_prefect.engines.openai.discovery import discover
from maserve_prefect.engines.openai.engine import OpenAIEngine
from maserve_prefect.engines.openai.wall import openai_replicas_factory
from maserve_prefect.engines.target import parse_engine
from maserve_prefect.protocol.requests import Request
from maserve_prefect.replay.driver import replay_trace
from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, RootRecord, Trace


def test_start_opens_the_warm_connections_without_sending_a_request() -> None:
    with serve(StubConfig()) as stub:
        info = discover(stub.url)
        before = list(stub.gets)
        with OpenAIEngine(stub.url, server_info=info, warm_connections=3) as eng:
            out = eng.wait(eng.submit(Request("a", "tiny", prompt_token_ids=(1, 2), max_tokens=2)))
        warm = stub.gets[len(before) :]
    assert warm == ["/v1/models"] * 3  # GETs only: no request reaches the server's counters
    assert out.attempts[0].start_s >= out.arrival_s


def test_a_replayed_request_is_submitted_when_it_is_sent_not_when_it_was_handed_over() -> None:
    # Two requests due at once on a client that sends one at a time: the second is handed to
    # the engine at once but sent only after the first finished; its TTFT starts at the send.
    ops = [
        OpRecord(op_id=f"{r}/a", root_id=r, kind=OpKind.MODEL, num_input_tokens=8,
                 num_output_tokens=4)
        for r in ("r1", "r2")
    ]  # fmt: skip
    roots = [RootRecord(root_id="r1"), RootRecord(root_id="r2")]
    trace = Trace(manifest=Manifest(trace_id="t"), roots=roots, ops=ops)
    with serve(StubConfig(chunk_delay_s=0.02)) as stub:
        target = parse_engine(f"openai:{stub.url}")
        factory = openai_replicas_factory(target, max_concurrency=1, server_info=discover(stub.url))
        run = replay_trace(trace, None, lock="length", replicas_factory=factory, timeout_s=30)
    t = {op.op_id: op.times for op in run.trace.ops}
    first, second = sorted(t.values(), key=lambda x: x.submitted_s or 0.0)
    assert first.completed_s is not None and second.submitted_s is not None
    assert second.ready_s is not None and second.ready_s < first.completed_s
    assert second.submitted_s >= first.completed_s  # sent after the slot freed, stamped then
    assert set(run.schedule_lag_s) == {"r1/a", "r2/a"}
    due, sent = run.schedule_lag_s[ops[0].op_id if t[ops[0].op_id] is second else ops[1].op_id]
    assert sent - due >= first.completed_s - due > 0  # the wait counts as schedule lag
