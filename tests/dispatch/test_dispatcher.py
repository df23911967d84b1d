"""The dispatcher's books: units a dead engine can never serve fail instead of waiting."""

from __future__ import annotations

import dataclasses

from dispatch_factories import make_request, make_sim_replicas, make_unit

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.dispatch.dispatcher import Dispatcher
from maserve_prefect.protocol.outcomes import OutcomeStatus
from maserve_prefect.protocol.state import Lifecycle


def test_units_of_a_dead_deployment_fail_instead_of_waiting_forever() -> None:
    k = Kernel()
    (rep,) = make_sim_replicas(k, ["r0"])
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
    op1 = make_unit("op1", root="root0", deployment="small", max_tokens=2)
    d.on_ready(op1, make_request(op1), on_done=done.append)
    assert len(done) == 1 and done[0].status is OutcomeStatus.FAILED
    assert "no live replica" in done[0].error and "r0=unreachable" in done[0].error
    # a deployment that merely has nothing accepting right now (loading) keeps its units waiting
    state["lifecycle"] = Lifecycle.LOADING
    op2 = make_unit("op2", root="root0", deployment="small", max_tokens=2)
    d.on_ready(op2, make_request(op2), on_done=done.append)
    assert len(done) == 1
