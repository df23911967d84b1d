"""The one dispatcher: events in, an immutable snapshot to a pure plan, decisions applied to engines.

Events — root arrival, unit ready, unit near-ready (every predecessor done or running, at least
one running), unit complete, lifecycle done — update the dispatcher's books. After each event it
builds a `Snapshot` (frozen: ready and near-ready units, replica views) and calls the active
plan's pure `plan(snapshot) -> Decisions`; the decisions (submit unit U to replica R) are then
applied to the pool, and engine outcomes come back as completion events. The task runner and the
replay driver both drive this same object; schedulers and HEAR policies only add plans (registered
by name in `dispatch.plans`) and snapshot fields.

Pool plans. Given a `PoolController` (`pool.control`: lifecycle, grant and lease books
over a pool), the dispatcher drives a pool plan (`joint`, `pool-fcfs`, `parrot`, `kairos`) the
same way, with three differences that plain plans never see:

- it plans once per instant, not once per event: an event asks for a replan at the current time
  on the pool's clock (LATE, after everything else due then), and events nested in an event
  (units made ready while a completion is handled) or inside `batch()` ask once, at the end — so
  a root's arrival or a completion and everything it releases are one decision;
- it plans on every event, with or without ready units (prefetch plans on near-ready and
  lifecycle-done events), and the snapshot is a `PoolSnapshot`;
- decisions carry lifecycle: the controller applies unloads, loads (held for `after`) and grants
  before the submits; a granted unit goes to its replica the moment it is ready.

Units reach a pool plan's window as they become known: `on_known` / `on_near_ready` reveal a unit
with its predecessors (sizes estimated until it is ready), `on_ready` brings its real request.
Events that carry no model call (a near-ready transform) change nothing and do not replan.

Threading: every method runs on the clock's thread (the lockstep gate's clock thread in virtual
time, or under the gate's lock in wall time), so the books need no locks of their own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from maserve_prefect.clock.kernel import LATE
from maserve_prefect.dispatch.plans import Decisions, Plan, ReplicaView, Snapshot, Unit, get_plan
from maserve_prefect.errors import ConfigError
from maserve_prefect.pool.window import WorkUnit
from maserve_prefect.protocol.controls import Control
from maserve_prefect.protocol.engine import Replica
from maserve_prefect.protocol.outcomes import Acceptance, Outcome, OutcomeStatus, Ticket
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.state import EngineState

if TYPE_CHECKING:
    from maserve_prefect.pool.control import PoolController

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


class PlanObserver(Protocol):
    """Called around every pool-mode plan (a measuring driver accounts waits there)."""

    def before_plan(self, now: float) -> None: ...

    def after_plan(self, now: float) -> None: ...


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
        pool: the pool's controller: turns on pool mode (module docstring); pool plans need it.
        observer: pool mode: called before and after every plan.

    Examples:
        >>> from maserve_prefect.clock.kernel import Kernel
        >>> from maserve_prefect.engines.sim.replica import SimReplica
        >>> from maserve_prefect.engines.sim.cost.step_time import make_step_model
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
        *,
        pool: PoolController | None = None,
        observer: PlanObserver | None = None,
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
        self.pool = pool
        self._observer = observer
        self._depth = 0  # pool mode: > 0 while an event is being handled or a batch is open
        self._held = False  # pool mode: an event inside the current batch asked for a replan
        self._replan_pending = False
        if pool is not None:
            pool.on_lifecycle_done = self.on_lifecycle_done

    # -- events ----------------------------------------------------------------------------

    def on_arrival(self, root_id: str) -> None:
        """A root task arrived."""
        self._arrivals[root_id] = self._now()
        if self.pool is not None:
            self.pool.arrive(root_id, self._now())
        self._event("arrival")

    def on_near_ready(self, unit: Unit, preds: Sequence[str] = ()) -> None:
        """A unit's predecessors are all done or running (at least one running).

        `preds`: the model calls it waits for (pool mode: its edges in the window).
        """
        if self.pool is not None:
            if self._reveal(unit, preds):
                self._event("near_ready")
            return
        if unit.unit_id not in self._ready and unit.unit_id not in self._inflight:
            self._near_ready[unit.unit_id] = unit
        self._event("near_ready")

    def on_known(self, unit: Unit, preds: Sequence[str] = ()) -> None:
        """A model call became known before it is ready (pool mode; plain plans ignore it)."""
        if self.pool is not None and self._reveal(unit, preds):
            self._event("known")

    def _reveal(self, unit: Unit, preds: Sequence[str]) -> bool:
        assert self.pool is not None
        uid = unit.unit_id
        if not unit.deployment or uid in self._ready or uid in self._inflight:
            return False  # not a model call, or already past what this event can tell
        if uid in self.pool.units:
            return False  # known: sizes come with its ready event
        work = WorkUnit(
            uid,
            unit.root_id,
            unit.deployment,
            unit.num_prompt_tokens,
            unit.max_tokens,
            preds=tuple(preds),
            priority=unit.priority,
            workflow=unit.workflow,
        )
        return self.pool.reveal(work, self._now())

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
        pending = _Pending(unit, request, controls, on_submitted, on_done)
        self._ready[unit.unit_id] = pending
        if self.pool is not None:
            target = self.pool.mark_ready(unit, self._now())
            if target is not None:  # a standing grant: straight to its replica
                del self._ready[unit.unit_id]
                self._submit(pending, self._replica(target))
        self._event("ready")

    def on_lifecycle_done(self, replica: str) -> None:
        """A replica finished a lifecycle action (loaded, woke, ...): capacity may have changed."""
        self._event("lifecycle_done")

    def _on_complete(self, pending: _Pending, replica: str, outcome: Outcome) -> None:
        self._inflight.pop(pending.unit.unit_id, None)
        self._outstanding[replica] = self._outstanding.get(replica, 1) - 1
        if self.pool is None:
            pending.on_done(outcome)
        else:
            with self.batch():  # what the completion releases is decided together with it
                self.pool.mark_done(pending.unit.unit_id, replica, self._now())
                pending.on_done(outcome)
        self._event("complete")

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Pool mode: events inside the block replan once, when the outermost block ends."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if self._depth == 0 and self._held:
            self._held = False
            self._request_replan()

    # -- planning --------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The immutable view a plan decides on (a `PoolSnapshot` in pool mode)."""
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
        if self.pool is not None:
            return self.pool.snapshot(self._now(), tuple(views))
        ready = tuple(
            sorted((p.unit for p in self._ready.values()), key=lambda u: (u.ready_s, u.unit_id))
        )
        near = tuple(sorted(self._near_ready.values(), key=lambda u: u.unit_id))
        return Snapshot(now_s=self._now(), ready=ready, near_ready=near, replicas=tuple(views))

    def _event(self, kind: str) -> None:
        self.stats.num_events += 1
        self.stats.by_event[kind] = self.stats.by_event.get(kind, 0) + 1
        if self.pool is not None:
            if self._depth:
                self._held = True
            else:
                self._request_replan()
            return
        if not self._ready:
            return
        snap = self.snapshot()
        decisions = self.plan.plan(snap)
        self.stats.num_plans += 1
        self._apply(decisions)
        self._fail_orphans(snap)

    def _request_replan(self) -> None:
        if not self._replan_pending:
            assert self.pool is not None
            self._replan_pending = True
            clock = self.pool.clock
            clock.call_at(clock.now(), self._replan, LATE, "replan")

    def _replan(self) -> None:
        assert self.pool is not None
        self._replan_pending = False
        now = self._now()
        if self._observer is not None:
            self._observer.before_plan(now)
        decisions = self.plan.plan(self.snapshot())
        self.stats.num_plans += 1
        self._apply(decisions)
        self.pool.check_thrash(self.plan.name)
        if self._observer is not None:
            self._observer.after_plan(now)

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

    def _replica(self, name: str) -> Replica:
        for r in self._replicas():
            if r.name == name:
                return r
        raise ConfigError(f"plan {self.plan.name!r} chose unknown replica {name!r}")

    def _apply(self, decisions: Decisions) -> None:
        if self.pool is not None:
            self.pool.apply(decisions, self.plan.name)
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
        now = (
            self._now()
        )  # handed to the engine now: a real engine may answer before submit returns
        ticket: Ticket = replica.submit(pending.request, pending.controls)
        if pending.on_submitted is not None:
            pending.on_submitted(now, replica.name)
        if ticket.acceptance is not Acceptance.ACCEPTED:
            self.stats.num_rejected += 1
            if self.pool is not None:
                self.pool.mark_done(pending.unit.unit_id, None, now)
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
        if self.pool is not None:
            self.pool.mark_submitted(pending.unit.unit_id, name, now)
        ticket.on_done(lambda outcome: self._on_complete(pending, name, outcome))
