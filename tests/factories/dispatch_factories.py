"""Factories for dispatcher and plan tests: units, replica views, plain snapshots, sim replicas.

Every `ReplicaView`, `Snapshot` and `Unit` a dispatch test builds by hand comes from here, so a
change of their fields is adapted in one place. Replicas for the dispatcher are simulated ones
with the roofline step model of a small model on an A100 (1000 KV blocks), serving "small";
`CountingReplica` records what the dispatcher hands a replica (and can reject), `stopped` makes
a replica report itself dead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.dispatch.snapshot import ReplicaView, Snapshot, Unit
from maserve_prefect.engines.sim.cost.step_time import make_step_model
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.protocol.capabilities import Capabilities
from maserve_prefect.protocol.controls import Control
from maserve_prefect.protocol.outcomes import Acceptance, Ticket
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.state import EngineState, Lifecycle

DEPLOYMENT = "small"


def make_view(
    name: str,
    num_outstanding: int = 0,
    *,
    deployment: str = "m",
    lifecycle: Lifecycle = Lifecycle.READY,
    max_outstanding: int | None = None,
) -> ReplicaView:
    """What a plan sees of one replica: `num_outstanding` calls in flight on it."""
    return ReplicaView(
        name=name,
        deployment=deployment,
        lifecycle=lifecycle,
        num_outstanding=num_outstanding,
        max_outstanding=max_outstanding,
    )


def make_unit(
    unit_id: str,
    *,
    root: str = "r",
    deployment: str = "m",
    num_prompt_tokens: int = 10,
    max_tokens: int = 1,
    ready_s: float = 0.0,
    priority: int = 0,
) -> Unit:
    return Unit(
        unit_id,
        root,
        deployment,
        num_prompt_tokens,
        max_tokens,
        priority=priority,
        ready_s=ready_s,
    )


def make_ready_units(*ids: str, deployment: str = "m") -> tuple[Unit, ...]:
    """Ready units of one root, ready in the order given (at 0, 1, 2, ... s)."""
    return tuple(make_unit(u, deployment=deployment, ready_s=float(i)) for i, u in enumerate(ids))


def make_plain_snapshot(
    ready: Iterable[Unit],
    replicas: Iterable[ReplicaView],
    *,
    near_ready: Iterable[Unit] = (),
    now_s: float = 0.0,
) -> Snapshot:
    """A plain (not pool-mode) plan input."""
    return Snapshot(now_s, tuple(ready), tuple(near_ready), tuple(replicas))


def make_request(unit: Unit) -> Request:
    """The model call a unit stands for (same id, deployment and sizes)."""
    return Request(
        unit.unit_id,
        unit.deployment,
        num_prompt_tokens=unit.num_prompt_tokens,
        max_tokens=unit.max_tokens,
    )


def make_sim_replicas(
    kernel: Kernel, names: Sequence[str], deployment: str = DEPLOYMENT
) -> list[SimReplica]:
    """Simulated replicas of `deployment` on `kernel`, in the order named."""
    step = make_step_model("Qwen3-0.6B", "A100-40GB")
    return [SimReplica(kernel, step, 1000, name=n, deployment=deployment) for n in names]


def stopped(replica: SimReplica) -> SimReplica:
    """`replica`, reporting itself stopped (a dead server): nothing will be served there."""
    replica.pool_lifecycle = Lifecycle.STOPPED
    return replica


class CountingReplica:
    """A replica that records the id of every request it is handed, and rejects those in
    `reject` (answering at once, as an engine that refuses does)."""

    def __init__(self, inner: SimReplica, reject: Iterable[str] = ()) -> None:
        self.inner = inner
        self.reject = frozenset(reject)
        self.submitted: list[str] = []
        self.name, self.deployment = inner.name, inner.deployment

    def state(self) -> EngineState:
        return self.inner.state()

    def capabilities(self) -> Capabilities:
        return self.inner.capabilities()

    def submit(self, request: Request, controls: Sequence[Control] = ()) -> Ticket:
        self.submitted.append(request.request_id)
        if request.request_id in self.reject:
            return Ticket(request.request_id, Acceptance.REJECTED, "the test rejects it")
        return self.inner.submit(request, controls)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)
