"""The one dispatcher: events in, an immutable snapshot to a pure plan, decisions applied to engines.

Events — root arrival, unit ready, unit near-ready (every predecessor done or running, at least
one running), unit complete, lifecycle done — update the dispatcher's books. After each event it
builds a `Snapshot` (frozen: ready and near-ready units, replica views) and calls the active
plan's pure `plan(snapshot) -> Decisions`; the decisions (submit unit U to replica R) are then
applied to the pool, and engine outcomes come back as completion events. The task runner and the
replay driver both drive this same object; schedulers and HEAR policies only add plans (registered
by name in `runtime.plans`) and snapshot fields.

Threading: every method runs on the clock's thread (the lockstep gate's clock thread in virtual
time, or under the gate's lock in wall time), so the books need no locks of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from maserve_prefect.engine.protocol import (
    Acceptance,
    Control,
    EngineState,
    Outcome,
    OutcomeStatus,
    Replica,
    Request,
    Ticket,
)
from maserve_prefect.errors import ConfigError
from maserve_prefect.runtime.plans import Decisions, Plan, ReplicaView, Snapshot, Unit, get_plan

DEAD_LIFECYCLES = frozenset({"stopped", "unreachable", "unloaded", "failed"})
"""Replica lifecycles from which nothing will ever be served again without outside action."""


def _failed(request: Request, now: float, error: str) -> Outcome:
    return Outcome(
        request_id=request.request_id,
        status=OutcomeStatus.FAILED,
        num_prompt_tokens=request.num_prompt(),
        num_output_tokens=0,
        num_cached_tokens=0,
        num_preemptions=0,
        realized_mode="",
        arrival_s=now,
        first_scheduled_s=None,
        first_token_s=None,
        finish_s=now,
        error=error,
    )


@dataclass(slots=True)
class _Pending:
    unit: Unit
    request: Request
    controls: tuple[Control, ...]
    on_submitted: Callable[[float, str], None] | None
    on_done: Callable[[Outcome], None]


@dataclass(slots=True)
class DispatcherStats:
    """Counters a report can show: events seen and decisions applied."""

    num_events: int = 0
    num_plans: int = 0
    num_submitted: int = 0
    num_rejected: int = 0
    by_event: dict[str, int] = field(default_factory=dict)


class Dispatcher:
    """Routes ready model calls to replicas through a named plan.

    Args:
        replicas: callable returning the current replicas (a Pool's `replicas`, or a fixed list).
        now: the clock's `now`.
        plan: a registered plan name (default "fcfs") or a `Plan` instance.

    Examples:
        >>> from maserve_prefect.engine.sim.kernel import Kernel
        >>> from maserve_prefect.engine.sim.replica import SimReplica
        >>> from maserve_prefect.engine.sim.step_time import make_step_model
        >>> k = Kernel()
        >>> r = SimReplica(k, make_step_model("Qwen3-0.6B", "A100-40GB"), 1000,
        ...                name="r0", deployment="small")
        >>> d = Dispatcher(lambda: [r], k.now)
        >>> req = Request("op1", "small", num_prompt_tokens=100, max_tokens=4)
        >>> done = []
        >>> d.on_ready(Unit("op1", "root0", "small", 100, 4), req, on_done=done.append)
        >>> k.run()
        >>> done[0].num_output_tokens
        4
    """

    def __init__(
        self,
        replicas: Callable[[], Sequence[Replica]],
        now: Callable[[], float],
        plan: str | Plan = "fcfs",
    ) -> None:
        self._replicas = replicas
        self._now = now
        self.plan: Plan = get_plan(plan) if isinstance(plan, str) else plan
        self._ready: dict[str, _Pending] = {}
        self._near_ready: dict[str, Unit] = {}
        self._outstanding: dict[str, int] = {}
        self._inflight: dict[str, str] = {}
        self._arrivals: dict[str, float] = {}
        self.stats = DispatcherStats()

    # -- events ----------------------------------------------------------------------------

    def on_arrival(self, root_id: str) -> None:
        """A root task arrived."""
        self._arrivals[root_id] = self._now()
        self._event("arrival")

    def on_near_ready(self, unit: Unit) -> None:
        """A unit's predecessors are all done or running (at least one running)."""
        if unit.unit_id not in self._ready and unit.unit_id not in self._inflight:
            self._near_ready[unit.unit_id] = unit
        self._event("near_ready")

    def on_ready(
        self,
        unit: Unit,
        request: Request,
        *,
        controls: tuple[Control, ...] = (),
        on_done: Callable[[Outcome], None],
        on_submitted: Callable[[float, str], None] | None = None,
    ) -> None:
        """A model call is ready to run; `on_done` receives its outcome (also for rejections)."""
        if unit.unit_id in self._ready or unit.unit_id in self._inflight:
            raise ConfigError(f"dispatcher: unit {unit.unit_id!r} was made ready twice")
        self._near_ready.pop(unit.unit_id, None)
        self._ready[unit.unit_id] = _Pending(unit, request, controls, on_submitted, on_done)
        self._event("ready")

    def on_lifecycle_done(self, replica: str) -> None:
        """A replica finished a lifecycle action (loaded, woke, ...): capacity may have changed."""
        self._event("lifecycle_done")

    def _on_complete(self, pending: _Pending, replica: str, outcome: Outcome) -> None:
        self._inflight.pop(pending.unit.unit_id, None)
        self._outstanding[replica] = self._outstanding.get(replica, 1) - 1
        pending.on_done(outcome)
        self._event("complete")

    # -- planning --------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The immutable view a plan decides on."""
        views = []
        for rep in self._replicas():
            st: EngineState = rep.state()
            views.append(
                ReplicaView(
                    name=rep.name,
                    deployment=rep.deployment,
                    lifecycle=st.lifecycle,
                    num_running=st.num_running,
                    num_waiting=st.num_waiting,
                    num_outstanding=self._outstanding.get(rep.name, 0),
                    kv_usage=st.kv_usage,
                )
            )
        ready = tuple(
            sorted((p.unit for p in self._ready.values()), key=lambda u: (u.ready_s, u.unit_id))
        )
        near = tuple(sorted(self._near_ready.values(), key=lambda u: u.unit_id))
        return Snapshot(now_s=self._now(), ready=ready, near_ready=near, replicas=tuple(views))

    def _event(self, kind: str) -> None:
        self.stats.num_events += 1
        self.stats.by_event[kind] = self.stats.by_event.get(kind, 0) + 1
        if not self._ready:
            return
        snap = self.snapshot()
        decisions = self.plan.plan(snap)
        self.stats.num_plans += 1
        self._apply(decisions)
        self._fail_orphans(snap)

    def _fail_orphans(self, snap: Snapshot) -> None:
        """Fail ready units whose deployment's replicas are all dead (stopped, unreachable).

        Nothing would ever take them: a server that died mid-run must surface as failed ops,
        not as ops waiting forever. A deployment with no replica at all keeps its units waiting
        (a pool plan may be loading one).
        """
        states: dict[str, list[str]] = {}
        for view in snap.replicas:
            states.setdefault(view.deployment, []).append(f"{view.name}={view.lifecycle}")
        dead = {
            dep
            for dep, items in states.items()
            if all(item.rpartition("=")[2] in DEAD_LIFECYCLES for item in items)
        }
        if not dead:
            return
        now = self._now()
        for unit_id in [u for u, p in self._ready.items() if p.unit.deployment in dead]:
            pending = self._ready.pop(unit_id)
            self.stats.num_rejected += 1
            pending.on_done(
                _failed(
                    pending.request,
                    now,
                    f"no live replica serves deployment {pending.unit.deployment!r} "
                    f"({', '.join(states[pending.unit.deployment])}); the engine is gone",
                )
            )

    def _apply(self, decisions: Decisions) -> None:
        by_name: Mapping[str, Replica] = {r.name: r for r in self._replicas()}
        for sub in decisions.submits:
            pending = self._ready.pop(sub.unit_id, None)
            if pending is None:
                raise ConfigError(
                    f"plan {self.plan.name!r} submitted unknown or already-submitted unit "
                    f"{sub.unit_id!r}"
                )
            replica = by_name.get(sub.replica)
            if replica is None:
                raise ConfigError(f"plan {self.plan.name!r} chose unknown replica {sub.replica!r}")
            self._submit(pending, replica)

    def _submit(self, pending: _Pending, replica: Replica) -> None:
        ticket: Ticket = replica.submit(pending.request, pending.controls)
        now = self._now()
        if pending.on_submitted is not None:
            pending.on_submitted(now, replica.name)
        if ticket.acceptance is not Acceptance.ACCEPTED:
            self.stats.num_rejected += 1
            pending.on_done(
                _failed(
                    pending.request,
                    now,
                    f"{ticket.acceptance.value} by {replica.name}: {ticket.reason}",
                )
            )
            return
        self.stats.num_submitted += 1
        self._inflight[pending.unit.unit_id] = replica.name
        self._outstanding[replica.name] = self._outstanding.get(replica.name, 0) + 1
        name = replica.name
        ticket.on_done(lambda outcome: self._on_complete(pending, name, outcome))
