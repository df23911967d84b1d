"""The books a dispatcher keeps for its plan, and when it plans.

One idea: the one `Dispatcher` handles events the same way whatever it drives; what differs
between a plain run and a pool run is *what is kept* between events and *when a plan runs*. A
`Books` object owns both. `PlainBooks` keeps the near-ready units and each root's home replica
and fails units nobody will ever serve; the pool runtime's `pool.control.PoolController` keeps
the known DAG, the pool's lifecycle and its leases, and applies lifecycle decisions. Neither
knows the other, and the dispatcher holds no mode flag.

`Cadence` says when a plan runs:

- `EACH_EVENT` (plain runs, the task runner, the fixed-work and request-level replays): right
  after the event, when some unit is ready;
- `per_instant(clock, priority)` (the pool runtime at LATE, the session replay at NORMAL): once
  per instant of the clock at that priority, after every event due then, whether or not a unit
  is ready (a pool plan prefetches on near-ready work); events inside `Dispatcher.batch()` ask
  once, when the batch ends.

Examples:
    >>> b = PlainBooks()
    >>> b.submitted("s1/t0", "r0", 0.0, root_id="s1"); b.submitted("s1/t1", "r1", 1.0, root_id="s1")
    >>> dict(b.homes)
    {'s1': 'r0'}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Generic, Protocol, TypeVar

from maserve_prefect.clock import Clock
from maserve_prefect.dispatch.snapshot import Decisions, ReplicaView, Snapshot, Unit

S = TypeVar("S", bound=Snapshot)


@dataclass(frozen=True, slots=True)
class Cadence:
    """When a dispatcher plans: after each event (`clock` None) or once per instant of `clock` at
    `priority` (see the module docstring)."""

    clock: Clock | None = None
    priority: int = 0

    @property
    def per_instant(self) -> bool:
        return self.clock is not None


EACH_EVENT = Cadence()


def per_instant(clock: Clock, priority: int) -> Cadence:
    """Plan once per instant of `clock`, at `priority` among the instant's callbacks."""
    return Cadence(clock, priority)


class Books(Protocol, Generic[S]):
    """What a dispatcher keeps for its plan between events (see the module docstring).

    Every method runs on the clock's thread. The `bool`-returning event methods say whether the
    books changed (an event that changes nothing neither counts nor plans).
    """

    @property
    def cadence(self) -> Cadence: ...

    def arrive(self, root_id: str, now: float) -> bool: ...

    def known(self, unit: Unit, preds: Sequence[str], now: float) -> bool: ...

    def near_ready(self, unit: Unit, preds: Sequence[str], now: float) -> bool: ...

    def ready(self, unit: Unit, now: float) -> str | None:
        """Record a ready unit; the replica a standing grant binds it to, if any."""
        ...

    def submitted(self, unit_id: str, replica: str, now: float, *, root_id: str) -> None: ...

    def done(self, unit_id: str, replica: str | None, now: float) -> None:
        """A unit ended (`replica` None: refused before it ran)."""
        ...

    def snapshot(
        self, now: float, ready: tuple[Unit, ...], replicas: tuple[ReplicaView, ...]
    ) -> S: ...

    def apply(self, decisions: Decisions, plan: str) -> None:
        """Carry out the decisions' non-submit part (lifecycle, grants) before the submits."""
        ...

    def after_plan(self, plan: str, snapshot: S) -> Sequence[tuple[str, str]]:
        """Checks after each plan; the ready units to fail now, with the reason."""
        ...


class PlainBooks:
    """Books of a plain dispatcher: near-ready units and root homes (module docstring).

    Args:
        cadence: when to plan (default: after each event).
    """

    def __init__(self, cadence: Cadence = EACH_EVENT) -> None:
        self._cadence = cadence
        self._near_ready: dict[str, Unit] = {}
        self._settled: set[str] = set()  # made ready: never near-ready again
        self.homes: dict[str, str] = {}

    @property
    def cadence(self) -> Cadence:
        return self._cadence

    def arrive(self, root_id: str, now: float) -> bool:
        return True

    def known(self, unit: Unit, preds: Sequence[str], now: float) -> bool:
        return False  # a plain plan decides on ready and near-ready units only

    def near_ready(self, unit: Unit, preds: Sequence[str], now: float) -> bool:
        if unit.unit_id not in self._settled:
            self._near_ready[unit.unit_id] = unit
        return True

    def ready(self, unit: Unit, now: float) -> str | None:
        self._near_ready.pop(unit.unit_id, None)
        self._settled.add(unit.unit_id)
        return None

    def submitted(self, unit_id: str, replica: str, now: float, *, root_id: str) -> None:
        self.homes.setdefault(root_id, replica)

    def done(self, unit_id: str, replica: str | None, now: float) -> None:
        return None

    def snapshot(
        self, now: float, ready: tuple[Unit, ...], replicas: tuple[ReplicaView, ...]
    ) -> Snapshot:
        near = tuple(sorted(self._near_ready.values(), key=lambda u: u.unit_id))
        # a root's home is set once and never changes, so a read-only view is as good as a copy
        return Snapshot(now, ready, near, replicas, MappingProxyType(self.homes))

    def apply(self, decisions: Decisions, plan: str) -> None:
        if decisions.loads or decisions.unloads or decisions.grants:
            raise ValueError(
                f"plan {plan!r} decided lifecycle or grants, which only a pool dispatcher "
                "applies; run it under the pool runtime (pool.dispatch)"
            )

    def after_plan(self, plan: str, snapshot: Snapshot) -> Sequence[tuple[str, str]]:
        """Fail ready units whose deployment's replicas are all dead (stopped, unreachable):
        nothing would ever take them, and a server that died mid-run must surface as failed ops,
        not as ops waiting forever. A deployment with no replica at all keeps its units waiting.
        """
        if not any(v.lifecycle.is_dead for v in snapshot.replicas):
            return ()
        states: dict[str, list[ReplicaView]] = {}
        for view in snapshot.replicas:
            states.setdefault(view.deployment, []).append(view)
        dead = {dep for dep, views in states.items() if all(v.lifecycle.is_dead for v in views)}
        if not dead:
            return ()
        return [
            (
                u.unit_id,
                f"no live replica serves deployment {u.deployment!r} ("
                + ", ".join(f"{v.name}={v.lifecycle.label}" for v in states[u.deployment])
                + "); the engine is gone",
            )
            for u in snapshot.ready
            if u.deployment in dead
        ]
