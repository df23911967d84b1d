"""The one dispatcher: events in, an immutable snapshot to a pure plan, decisions applied to engines.

Events — root arrival, unit known, unit near-ready (every predecessor done or running, at least
one running), unit ready, unit complete, lifecycle done — update the books. When the books'
cadence says so (`dispatch.books`), the dispatcher builds a snapshot (the ready units in the
order it heard of them, a view of every replica: its lifecycle and the requests this dispatcher
has in flight there) and calls the active plan's pure `plan(snapshot) -> Decisions`; the books
apply the decisions' lifecycle part, the dispatcher submits, and engine outcomes come back as
completion events. The task runner, every replay (fixed-work, request-level, sessions) and the
pool runtime drive this same object; they differ only in the plan (`dispatch.plans`, by name)
and the books (`PlainBooks`, or the pool runtime's `PoolController`).

A unit the engine refuses at submission, or that no live replica will ever serve, ends at once
with a synthetic `Outcome` (status REJECTED, or FAILED with the reason) through its `on_done`,
so a caller always gets exactly one outcome per ready unit.

Failover (`dispatch.failover`): with a `Failover` (a fleet of endpoints), a unit that ended badly
on a replica the failover says stopped answering — or was refused by one it has marked dead — is
made ready again with its attempts so far, and the same plan places it on a live replica; its
one outcome, when it comes, carries every attempt.

Threading: every method runs on the clock's thread (the lockstep gate's clock thread in virtual
time, or under the gate's lock in wall time), so the books need no locks of their own.

Examples:
    >>> from maserve_prefect.clock.kernel import Kernel
    >>> from maserve_prefect.engines.sim.replica import SimReplica
    >>> from maserve_prefect.engines.sim.cost.step_time import make_step_model
    >>> from maserve_prefect.protocol.requests import Request
    >>> k = Kernel()
    >>> r = SimReplica(k, make_step_model("Qwen3-0.6B", "A100-40GB"), 1000,
    ...                name="r0", deployment="small")
    >>> d = Dispatcher(lambda: [r], k.now)
    >>> req = Request("op1", "small", num_prompt_tokens=100, max_tokens=4)
    >>> done = []
    >>> d.on_ready(Unit("op1", "root0", "small", 100, 4), req, on_done=done.append)
    >>> k.run()
    >>> done[0].num_output_tokens, d.stats.num_submitted
    (4, 1)
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from maserve_prefect.dispatch.books import Books, PlainBooks
from maserve_prefect.dispatch.failover import Failover, lost_attempts, with_attempts
from maserve_prefect.dispatch.plans import Plan, get_plan
from maserve_prefect.dispatch.routes import PrefixProbe, replica_prefix_probe
from maserve_prefect.dispatch.snapshot import Decisions, ReplicaView, Snapshot, Unit
from maserve_prefect.errors import ConfigError
from maserve_prefect.protocol.controls import Control
from maserve_prefect.protocol.engine import Replica
from maserve_prefect.protocol.outcomes import Acceptance, Attempt, Outcome, OutcomeStatus, Ticket
from maserve_prefect.protocol.requests import Request


def _ended(request: Request, now: float, status: OutcomeStatus, error: str) -> Outcome:
    """The outcome of a unit that never ran (refused, or nothing will serve it)."""
    return Outcome(
        request_id=request.request_id,
        status=status,
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
    carried: tuple[Attempt, ...] = ()
    """Attempts made on replicas that stopped answering (failover), oldest first."""
    num_reroutes: int = 0

    def end(self, outcome: Outcome) -> None:
        """Hand the unit's one outcome to its caller, with the attempts it carries."""
        self.on_done(with_attempts(outcome, self.carried))


class PlanObserver(Protocol):
    """Called around every plan (a measuring driver accounts waits there)."""

    def before_plan(self, now: float) -> None: ...

    def after_plan(self, now: float) -> None: ...


@dataclass(slots=True)
class DispatcherStats:
    """Counters a report can show: events seen and decisions applied."""

    num_events: int = 0
    num_plans: int = 0
    num_submitted: int = 0
    num_rejected: int = 0
    num_rerouted: int = 0
    by_event: dict[str, int] = field(default_factory=dict)


class Dispatcher:
    """Routes ready model calls to replicas through a named plan (see the module docstring).

    Args:
        replicas: callable returning the current replicas (a Pool's `replicas`, or a fixed list).
        now: the clock's `now`.
        plan: a registered plan name (default "fcfs") or a `Plan` instance.
        books: what is kept between events and when to plan (default `PlainBooks()`: plan after
            each event); the pool runtime passes its `PoolController`.
        observer: called before and after every plan.
        max_outstanding: per replica name, the most requests this dispatcher keeps there at once
            (a harness's concurrency cap; plans see it in `ReplicaView.max_outstanding`).
        prefix_probe: how a plan that places by cached prefix (`needs_prefix`, e.g. `prefix`)
            learns what each replica holds for a ready request (default: the replica's own
            `cached_prefix_tokens`, 0 for a replica without one; `dispatch.routes`).
        failover: re-places units whose replica stopped answering (`dispatch.failover`); None:
            every outcome goes straight to its caller.
    """

    def __init__(
        self,
        replicas: Callable[[], Sequence[Replica]],
        now: Callable[[], float],
        plan: str | Plan[Any] = "fcfs",
        *,
        books: Books[Snapshot] | None = None,
        observer: PlanObserver | None = None,
        max_outstanding: Mapping[str, int] | None = None,
        prefix_probe: PrefixProbe = replica_prefix_probe,
        failover: Failover | None = None,
    ) -> None:
        self._replicas = replicas
        self._now = now
        self.plan: Plan[Any] = get_plan(plan) if isinstance(plan, str) else plan
        self.books: Books[Snapshot] = books if books is not None else PlainBooks()
        self._cadence = self.books.cadence
        self._caps = dict(max_outstanding or {})
        self._probe = prefix_probe
        self._failover = failover
        self._planning = False  # a plan is being applied: events now plan again after it
        self._replan = False
        self._session_homes: dict[str, str] = {}
        self._ready: dict[str, _Pending] = {}  # in the order they became ready
        self._inflight: dict[str, str] = {}
        self._outstanding: dict[str, int] = {}
        self._views: dict[str, ReplicaView] = {}
        self.stats = DispatcherStats()
        self._observer = observer
        self._depth = 0  # > 0 while a batch is open
        self._held = False  # an event inside the open batch asked for a plan
        self._plan_pending = False
        attach = getattr(self.books, "attach", None)
        if attach is not None:
            attach(self.on_lifecycle_done)

    @property
    def failover(self) -> Failover | None:
        """What re-places units whose replica stopped answering (None: nothing does)."""
        return self._failover

    # -- events ----------------------------------------------------------------------------

    def on_arrival(self, root_id: str) -> None:
        """A root task arrived."""
        if self.books.arrive(root_id, self._now()):
            self._event("arrival")

    def on_known(self, unit: Unit, preds: Sequence[str] = ()) -> None:
        """A model call became known before it is ready (`preds`: the model calls it waits for);
        plain books ignore it, a pool's window shows it."""
        if self._settled(unit.unit_id):
            return
        if self.books.known(unit, preds, self._now()):
            self._event("known")

    def on_near_ready(self, unit: Unit, preds: Sequence[str] = ()) -> None:
        """A unit's predecessors are all done or running (at least one running)."""
        if self._settled(unit.unit_id):
            if self._cadence.per_instant:
                return
            self._event("near_ready")  # a plain dispatcher counts it all the same
            return
        if self.books.near_ready(unit, preds, self._now()):
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
        """A model call is ready to run; `on_done` receives its outcome (also for refusals)."""
        if self._settled(unit.unit_id):
            raise ConfigError(f"dispatcher: unit {unit.unit_id!r} was made ready twice")
        pending = _Pending(unit, request, controls, on_submitted, on_done)
        self._ready[unit.unit_id] = pending
        target = self.books.ready(unit, self._now())
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
        if self._rerouted(pending, replica, outcome):
            return
        with self.batch():  # what the completion releases is decided together with it
            self.books.done(pending.unit.unit_id, replica, self._now())
            pending.end(outcome)
        self._event("complete")

    def _rerouted(self, pending: _Pending, replica: str, outcome: Outcome) -> bool:
        """Make the unit ready again when the failover says its replica stopped answering."""
        failover = self._failover
        if (
            failover is None
            or outcome.status is OutcomeStatus.COMPLETED
            or not failover.reroute(replica, outcome, pending.num_reroutes)
        ):
            return False
        unit = pending.unit
        now = self._now()
        pending.carried += lost_attempts(outcome, replica)
        pending.num_reroutes += 1
        self.stats.num_rerouted += 1
        ran = outcome.status is not OutcomeStatus.REJECTED  # refused at submission: never ran
        self.books.done(unit.unit_id, replica if ran else None, now)
        self._ready[unit.unit_id] = pending
        self.books.ready(unit, now)
        self._event("reroute")
        return True

    def _settled(self, unit_id: str) -> bool:
        return unit_id in self._ready or unit_id in self._inflight

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Per-instant cadence: events inside the block plan once, when the outermost block
        ends (after each event, plans run as they come)."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if self._depth == 0 and self._held:
            self._held = False
            self._request_plan()

    def max_model_len(self, deployment: str) -> int | None:
        """The smallest max model length among `deployment`'s replicas that state one
        (`Capabilities.max_model_len`); None when none does."""
        lens = [
            n
            for r in self._replicas()
            if r.deployment == deployment
            and (n := getattr(r.capabilities(), "max_model_len", None)) is not None
        ]
        return min(lens) if lens else None

    # -- planning --------------------------------------------------------------------------

    def views(self) -> tuple[ReplicaView, ...]:
        """Every replica as plans see it: lifecycle, this dispatcher's load on it, its cap.

        A view is rebuilt only when its replica's lifecycle or load changed since the last plan
        (views are frozen values, so an unchanged one is shared between snapshots).
        """
        out = self._outstanding
        cache = self._views
        views = []
        for rep in self._replicas():
            name = rep.name
            lifecycle = rep.lifecycle
            n = out.get(name, 0)
            v = cache.get(name)
            if (
                v is None
                or v.lifecycle is not lifecycle
                or v.num_outstanding != n
                or v.deployment != rep.deployment
            ):
                v = ReplicaView(name, rep.deployment, lifecycle, n, self._caps.get(name))
                cache[name] = v
            views.append(v)
        return tuple(views)

    def snapshot(self) -> Snapshot:
        """The immutable view a plan decides on (the books' snapshot type)."""
        ready = tuple(p.unit for p in self._ready.values())
        snap = self.books.snapshot(self._now(), ready, self.views())
        if self._session_homes:
            # a session's home is set once and never changes: a read-only view is as good
            snap = dataclasses.replace(snap, session_homes=MappingProxyType(self._session_homes))
        if getattr(self.plan, "needs_prefix", False) and ready:
            snap = dataclasses.replace(snap, cached_tokens=self._cached_tokens())
        return snap

    def _cached_tokens(self) -> dict[str, dict[str, int]]:
        """Per ready unit, per accepting replica of its deployment, the prompt tokens the
        replica holds cached for it (only nonzero entries)."""
        reps = [r for r in self._replicas() if r.lifecycle.accepting]
        out: dict[str, dict[str, int]] = {}
        for uid, pending in self._ready.items():
            dep = pending.unit.deployment
            hits = {}
            for r in reps:
                if not r.deployment or r.deployment == dep:
                    n = self._probe(r, pending.request)
                    if n > 0:
                        hits[r.name] = n
            if hits:
                out[uid] = hits
        return out

    def _event(self, kind: str) -> None:
        self.stats.num_events += 1
        self.stats.by_event[kind] = self.stats.by_event.get(kind, 0) + 1
        if self._cadence.per_instant:
            if self._depth:
                self._held = True
            else:
                self._request_plan()
        elif self._planning:
            self._replan = True  # an event raised while a plan is applied: plan once after it
        elif self._ready:
            self._plan()

    def _request_plan(self) -> None:
        if not self._plan_pending:
            clock = self._cadence.clock
            assert clock is not None
            self._plan_pending = True
            clock.call_at(clock.now(), self._planned, self._cadence.priority, "dispatch plan")

    def _planned(self) -> None:
        self._plan_pending = False
        self._plan()

    def _plan(self) -> None:
        self._planning = True
        try:
            self._plan_once()
            while self._replan and self._ready:
                self._replan = False
                self._plan_once()
        finally:
            self._planning = self._replan = False

    def _plan_once(self) -> None:
        now = self._now()
        if self._observer is not None:
            self._observer.before_plan(now)
        snap = self.snapshot()
        decisions = self.plan.plan(snap)
        self.stats.num_plans += 1
        self._apply(decisions)
        for unit_id, reason in self.books.after_plan(self.plan.name, snap):
            pending = self._ready.pop(unit_id, None)
            if pending is not None:
                self.stats.num_rejected += 1
                if self._failover is not None:
                    reason = self._failover.no_live_reason(pending.unit.deployment) or reason
                pending.end(_ended(pending.request, now, OutcomeStatus.FAILED, reason))
        if self._observer is not None:
            self._observer.after_plan(now)

    def _replica(self, name: str) -> Replica:
        for r in self._replicas():
            if r.name == name:
                return r
        raise ConfigError(f"plan {self.plan.name!r} chose unknown replica {name!r}")

    def _apply(self, decisions: Decisions) -> None:
        self.books.apply(decisions, self.plan.name)
        if not decisions.submits:
            return
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
        unit = pending.unit
        if ticket.acceptance is not Acceptance.ACCEPTED:
            error = f"{ticket.acceptance.value} by {replica.name}: {ticket.reason}"
            refused = _ended(pending.request, now, OutcomeStatus.REJECTED, error)
            if self._rerouted(pending, replica.name, refused):
                return
            self.stats.num_rejected += 1
            self.books.done(unit.unit_id, None, now)
            pending.end(refused)
            return
        self.stats.num_submitted += 1
        name = replica.name
        self._inflight[unit.unit_id] = name
        self._outstanding[name] = self._outstanding.get(name, 0) + 1
        self.books.submitted(unit.unit_id, name, now, root_id=unit.root_id)
        if unit.session_id:
            self._session_homes.setdefault(unit.session_id, name)
        ticket.on_done(lambda outcome: self._on_complete(pending, name, outcome))
