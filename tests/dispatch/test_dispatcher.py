"""The dispatcher's books: units a dead engine can never serve fail instead of waiting."""

from __future__ import annotations

import dataclasses

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.dispatch.dispatcher import Dispatcher
from maserve_prefect.dispatch.snapshot import Unit
from maserve_prefect.engines.sim.cost.step_time import make_step_model
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.protocol.outcomes import OutcomeStatus
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.state import Lifecycle


def test_units_of_a_dead_deployment_fail_instead_of_waiting_forever() -> None:
    k = Kernel()
    rep = SimReplica(k, make_step_model("Qwen3-0.6B", "A100-40GB"), 1000, name="r0",
                     deployment="small")  # fmt: skip
    state = {"lifecycle": Lifecycle.UNREACHABLE}

    class Dead:  # the replica as a dead server reports itself
        name, deployment = "r0", "small"

        @property
        def lifecycle(self) -> Lifecycle:
            return state["lifecycle"]

        def state(self):  # type: ignore[no-untyped-def]
            return dataclasses.replace(rep.state(), lifecycle=state["lifecycle"])

        def submit(self, request, controls=()):  # type: ignore[no-untyped-def]
            raise AssertionError("a dead replica must not be given work")

    done: list = []
    d = Dispatcher(lambda: [Dead()], k.now)  # type: ignore[list-item]
    d.on_ready(Unit("op1", "root0", "small", 10, 2), Request("op1", "small", num_prompt_tokens=10),
               on_done=done.append)  # fmt: skip
    assert len(done) == 1 and done[0].status is OutcomeStatus.FAILED
    assert "no live replica" in done[0].error and "r0=unreachable" in done[0].error
    # a deployment that merely has nothing accepting right now (loading) keeps its units waiting
    state["lifecycle"] = Lifecycle.LOADING
    d.on_ready(Unit("op2", "root0", "small", 10, 2), Request("op2", "small", num_prompt_tokens=10),
               on_done=done.append)  # fmt: skip
    assert len(done) == 1
