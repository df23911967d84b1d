"""Every op kind records when it was submitted, and a tool's measured wall time is kept in the
ledger (beside the record, never in it: bundles carry virtual durations only)."""

from __future__ import annotations

from typing import Any

import pytest
from maserve_prefect.tasks import Artifact, state_read, state_write, tool_call, transform
from prefect import flow

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.taskrunner.harness import Harness, activate
from maserve_prefect.taskrunner.lockstep import VirtualGate
from maserve_prefect.taskrunner.oprun import scope
from maserve_prefect.taskrunner.runner import MAServeTaskRunner
from maserve_prefect.tools import ToolResult
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import Manifest, OpKind

pytestmark = pytest.mark.usefixtures("prefect_api")

MEASURED_WALL_S = 0.0625
"""The wall duration the stubbed tool reports (a fixed value: tests never assert wall times)."""
VIRTUAL_TOOL_S = 2.0


@flow(task_runner=MAServeTaskRunner(max_workers=2))
def mixed_flow() -> None:
    with scope(root_id="r0", stage_id="s", session_id="a"):
        seed = Artifact("seed", "x", {"answer": "7"})
        tool = tool_call.submit(
            tool="calculator", args={"expression": "1+1"}, virtual_duration_s=VIRTUAL_TOOL_S
        )
        picked = transform.submit(fn="select_field", inputs=[tool, seed], arg="ok")
        written = state_write.submit(name="notes", value=picked)
        read = state_read.submit(name="notes", wait_for=[written])
        read.wait()


def _run_mixed(monkeypatch: pytest.MonkeyPatch) -> tuple[Harness, Ledger]:
    def fake_call_tool(name: str, **kwargs: Any) -> ToolResult:
        return ToolResult(tool_name=name, output=2, ok=True, duration_s=MEASURED_WALL_S)

    monkeypatch.setattr("maserve_prefect.tasks.tool.call_tool", fake_call_tool)
    ledger = Ledger("sqlite://", MemoryStore())
    gate = VirtualGate(Kernel())
    harness = Harness(gate, Manifest(trace_id="times"), ledger=ledger)
    with gate, activate(harness):
        mixed_flow()
    return harness, ledger


def test_every_op_kind_records_submitted_s(monkeypatch: pytest.MonkeyPatch) -> None:
    harness, ledger = _run_mixed(monkeypatch)
    ops = {op.kind: op for op in ledger.load_trace("times").ops}
    assert set(ops) == {OpKind.TOOL, OpKind.TRANSFORM, OpKind.STATE_WRITE, OpKind.STATE_READ}
    for kind, op in ops.items():
        t = op.times
        assert t.ready_s is not None and t.submitted_s is not None and t.completed_s is not None
        assert t.ready_s <= t.submitted_s <= t.completed_s, kind
    # On the virtual clock a non-model op starts the instant it is released, and the tool's
    # virtual duration is its submitted → completed span.
    tool = ops[OpKind.TOOL].times
    assert tool.submitted_s == tool.ready_s == 0.0
    assert tool.completed_s == pytest.approx(VIRTUAL_TOOL_S)
    assert ops[OpKind.TRANSFORM].times.submitted_s == pytest.approx(VIRTUAL_TOOL_S)
    assert [op.times for op in harness.book.ops] == [
        op.times for op in ledger.load_trace("times").ops
    ]


def test_tool_wall_duration_is_kept_in_the_ledger_not_the_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, ledger = _run_mixed(monkeypatch)
    trace = ledger.load_trace("times")
    tool = next(op for op in trace.ops if op.kind is OpKind.TOOL)
    assert tool.tool_duration_s == VIRTUAL_TOOL_S  # the run's (virtual) clock
    assert "wall" not in tool.to_json_line()  # bundles stay deterministic
    walls = ledger.tool_wall_times("times")
    assert walls == {(tool.op_id, 1): MEASURED_WALL_S}
