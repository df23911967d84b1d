"""Native runs tell the dispatcher when each root arrives: once per root, at the root's recorded
arrival time, before any event of that root's ops."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from prefect import flow, task

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.dispatch.dispatcher import Dispatcher
from maserve_prefect.dispatch.snapshot import Unit
from maserve_prefect.engines.sim.cost.step_time import make_step_model
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.protocol.controls import Control
from maserve_prefect.protocol.outcomes import Outcome
from maserve_prefect.protocol.requests import Request
from maserve_prefect.taskrunner.harness import Harness, activate, active_harness
from maserve_prefect.taskrunner.lockstep import VirtualGate
from maserve_prefect.taskrunner.oprun import current_op, scope
from maserve_prefect.taskrunner.runner import MAServeTaskRunner
from maserve_prefect.trace.model import Manifest

pytestmark = pytest.mark.usefixtures("prefect_api")


class RecordingDispatcher(Dispatcher):
    """The dispatcher, logging `(event, root, id, now)` of arrivals and unit events."""

    def __init__(self, replicas: Sequence[SimReplica], now: Callable[[], float]) -> None:
        super().__init__(lambda: replicas, now)
        self.log: list[tuple[str, str, str, float]] = []

    def on_arrival(self, root_id: str) -> None:
        self.log.append(("arrival", root_id, root_id, self._now()))
        super().on_arrival(root_id)

    def on_near_ready(self, unit: Unit, preds: Sequence[str] = ()) -> None:
        self.log.append(("near_ready", unit.root_id, unit.unit_id, self._now()))
        super().on_near_ready(unit, preds)

    def on_ready(
        self,
        unit: Unit,
        request: Request,
        *,
        controls: tuple[Control, ...] = (),
        on_done: Callable[[Outcome], None],
        on_submitted: Callable[[float, str], None] | None = None,
    ) -> None:
        self.log.append(("ready", unit.root_id, unit.unit_id, self._now()))
        super().on_ready(
            unit, request, controls=controls, on_done=on_done, on_submitted=on_submitted
        )


@task
def call(*upstream: object) -> int:
    """A model call of 2 tokens on the run's engine."""
    h, op = active_harness(), current_op()
    assert h is not None and op is not None
    outcome = h.call_model(op, Request(op.op_id, "small", num_prompt_tokens=8, max_tokens=2))
    return outcome.num_output_tokens


@flow(task_runner=MAServeTaskRunner(max_workers=4))
def two_roots_flow() -> None:
    with scope(root_id="r0", stage_id="a"):
        first = call.submit()
        call.submit(first)
    first.wait()  # r1 arrives later than r0
    with scope(root_id="r1", stage_id="a"):
        late = call.submit()
    with scope(root_id="r0", stage_id="b", session_id="x"):  # r0 again: no second arrival
        call.submit(late).wait()


def test_each_root_arrives_once_before_its_first_event() -> None:
    gate = VirtualGate(Kernel())
    step = make_step_model("Qwen3-0.6B", "A100-40GB")
    replica = SimReplica(gate.kernel, step, 1000, name="rep0", deployment="small")
    dispatcher = RecordingDispatcher([replica], gate.now)
    harness = Harness(gate, Manifest(trace_id="arrivals"), dispatcher=dispatcher)
    with gate, activate(harness):
        two_roots_flow()

    log = dispatcher.log
    arrivals = [(root, t) for event, root, _, t in log if event == "arrival"]
    assert arrivals == [("r0", 0.0), ("r1", harness.book.roots["r1"].arrival_s)]
    assert arrivals[1][1] > 0.0  # r1 arrived after r0's first call finished
    assert dispatcher.stats.by_event["arrival"] == 2
    for root, _ in arrivals:
        events = [event for event, r, _, _ in log if r == root]
        assert events[0] == "arrival" and "ready" in events, root
    ready_roots = {r for event, r, _, _ in log if event == "ready"}
    assert ready_roots == {"r0", "r1"}
    assert len(harness.book.ops) == 4
