"""An OpenAIEngine attached to the caller's event loop: the wall-clock replay's engine."""

from __future__ import annotations

import asyncio

import pytest
from openai_stub import StubConfig, serve

from maserve_prefect.engines.openai.engine import OpenAIEngine
from maserve_prefect.errors import EngineError
from maserve_prefect.protocol.outcomes import OutcomeStatus
from maserve_prefect.protocol.requests import Request
from maserve_prefect.replay.conformance import audit
from maserve_prefect.replay.driver import replay_trace
from maserve_prefect.trace.model import Dep, EdgeKind, Manifest, OpKind, OpRecord, RootRecord, Trace


def test_attached_engine_runs_on_the_callers_loop_thread() -> None:
    with serve(StubConfig()) as stub:

        async def main() -> tuple[OutcomeStatus, int, bool]:
            eng = OpenAIEngine(stub.url).attach()
            seen: list[bool] = []
            ticket = eng.submit(
                Request("a", "tiny", prompt_token_ids=(1, 2, 3), max_tokens=4, min_tokens=4)
            )
            loop_thread = asyncio.get_running_loop()
            fut = loop_thread.create_future()

            def done(out: object) -> None:
                seen.append(asyncio.get_running_loop() is loop_thread)
                fut.set_result(out)

            ticket.on_done(done)
            out = await fut
            with pytest.raises(EngineError, match="aclose"):
                eng.close()
            await eng.aclose()
            return out.status, out.num_output_tokens, all(seen)

        status, n, same_loop = asyncio.run(main())
    assert status is OutcomeStatus.COMPLETED and n == 4 and same_loop


def test_attach_needs_a_running_loop() -> None:
    with serve(StubConfig()) as stub, pytest.raises(EngineError, match="running event loop"):
        OpenAIEngine(stub.url).attach()


def test_wall_replay_on_an_openai_server_keeps_counts_and_order() -> None:
    ops = [
        OpRecord(op_id="r/a", root_id="r", kind=OpKind.MODEL, num_input_tokens=30,
                 num_output_tokens=6),
        OpRecord(op_id="r/b", root_id="r", kind=OpKind.MODEL, num_input_tokens=40,
                 num_output_tokens=3, deps=(Dep(op_id="r/a", kind=EdgeKind.DATA),)),
    ]  # fmt: skip
    trace = Trace(manifest=Manifest(trace_id="t"), roots=[RootRecord(root_id="r")], ops=ops)
    with serve(StubConfig()) as stub:
        run = replay_trace(trace, None, lock="length", engine=f"openai:{stub.url}", timeout_s=30)
    got = run.trace.op_index()
    assert [(got[o.op_id].num_input_tokens, got[o.op_id].num_output_tokens) for o in ops] == [
        (30, 6),
        (40, 3),
    ]
    assert got["r/b"].times.ready_s >= got["r/a"].times.completed_s  # type: ignore[operator]
    rep = audit(run, trace)
    assert rep.num_early_releases == 0 and not rep.token_mismatches
    assert run.trace.manifest.engine == f"openai:{stub.url}"
