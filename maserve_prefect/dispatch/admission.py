"""Ordered admission: a harness-side order over the ready units, least-loaded or sticky placement.

One idea: when a harness caps how many requests each replica holds (`ReplicaView.max_outstanding`,
an agent framework's concurrency limit), the ready units wait in front of the replicas and *which
waiting unit goes next* is the harness's decision. `OrderedPlan` asks an ordering hook — HEAR's
policies (FCFS, Cache-Aware, Guard-W) plug in here through the session replay — for the order,
then places units in that order while some replica has room: with `sticky`, a unit goes only to
its root's home (the replica its root's first unit ran on, the only place its prefix is cached)
and waits while the home is full; otherwise, and for a root's first unit, to the least-loaded
replica with room (`fcfs.least_loaded`). Units it cannot place stay ready for a later plan.

Registered as `ordered` and `sticky` (`dispatch.plans`). The hook receives the ready units in
the order the dispatcher heard of them and returns unit ids; leaving one out keeps it waiting,
an id that is not ready or appears twice is a `ConfigError`. The hook is the one part a plan
does not own: HEAR's hooks read the engines' residency through their own KV-event mirror and
time themselves, so this plan is pure only when its hook is.

Examples:
    >>> from maserve_prefect.protocol.state import Lifecycle
    >>> units = tuple(Unit(f"s{i}/t0", f"s{i}", "m", 10, 1, ready_s=float(i)) for i in range(3))
    >>> views = (ReplicaView("x", "m", Lifecycle.READY, 0, max_outstanding=1),
    ...          ReplicaView("y", "m", Lifecycle.READY, 0, max_outstanding=1))
    >>> lifo = lambda ready, now: [u.unit_id for u in reversed(ready)]
    >>> d = OrderedPlan(order=lifo).plan(Snapshot(3.0, units, (), views))
    >>> [(s.unit_id, s.replica) for s in d.submits]
    [('s2/t0', 'x'), ('s1/t0', 'y')]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from maserve_prefect.dispatch.fcfs import least_loaded
from maserve_prefect.dispatch.snapshot import Decisions, ReplicaView, Snapshot, Submit, Unit
from maserve_prefect.errors import ConfigError
from maserve_prefect.protocol.views import fcfs_order

OrderHook = Callable[[Sequence[Unit], float], Sequence[str]]
"""`order(ready_units, now_s) -> unit ids`, first to go first."""


def fcfs_hook(ready: Sequence[Unit], now_s: float) -> list[str]:
    """The default order: first come, first served (`protocol.views.fcfs_order`)."""
    return [u.unit_id for u in fcfs_order(ready, lambda u: u.ready_s, lambda u: u.unit_id)]


class OrderedPlan:
    """Hook-ordered admission with least-loaded or sticky placement (module docstring).

    Args:
        order: the ordering hook (default FCFS).
        sticky: keep every unit of a root on its root's home replica.
    """

    def __init__(self, order: OrderHook | None = None, *, sticky: bool = False) -> None:
        self.order = order or fcfs_hook
        self.sticky = sticky
        self.name = "sticky" if sticky else "ordered"

    def plan(self, snapshot: Snapshot) -> Decisions:
        views = snapshot.replicas
        if not snapshot.ready or not any(v.has_room for v in views):
            return Decisions()
        ranked = self._ranked(snapshot)
        by_id = {u.unit_id: u for u in snapshot.ready}
        load = {v.name: v.num_outstanding for v in views}
        by_name = {v.name: v for v in views}
        homes = dict(snapshot.homes)
        submits: list[Submit] = []
        for uid in ranked:
            unit = by_id[uid]
            target = self._place(unit, views, by_name, homes, load)
            if target is None:
                if not any(_room(v, load) for v in views):
                    break
                continue
            load[target.name] += 1
            homes.setdefault(unit.root_id, target.name)
            submits.append(Submit(uid, target.name))
        return Decisions(submits=tuple(submits))

    def _ranked(self, snapshot: Snapshot) -> list[str]:
        ranked = list(self.order(snapshot.ready, snapshot.now_s))
        if len(set(ranked)) != len(ranked):
            raise ConfigError(f"the ordering hook returned duplicate ids: {ranked[:10]}")
        ready = {u.unit_id for u in snapshot.ready}
        for uid in ranked:
            if uid not in ready:
                raise ConfigError(
                    f"the ordering hook returned {uid!r}, which is not waiting; return ids of "
                    "the waiting units it was given"
                )
        return ranked

    def _place(
        self,
        unit: Unit,
        views: Sequence[ReplicaView],
        by_name: dict[str, ReplicaView],
        homes: dict[str, str],
        load: dict[str, int],
    ) -> ReplicaView | None:
        home = homes.get(unit.root_id)
        if self.sticky and home is not None:
            view = by_name.get(home)
            return view if view is not None and _room(view, load) else None
        return least_loaded((v for v in views if v.accepting and v.serves(unit.deployment)), load)


def _room(view: ReplicaView, load: dict[str, int]) -> bool:
    cap = view.max_outstanding
    return view.accepting and (cap is None or load[view.name] < cap)
