"""The built-in plan: first come, first served, each unit on the least-loaded replica.

One idea: FCFS is one order — by ready time, ties by unit id (`protocol.views.fcfs_order`, the
same order HEAR's `Fcfs` policy uses) — and least-loaded is one placement rule,
`least_loaded`: the accepting replica of the unit's deployment with the fewest outstanding
requests, ties by name, counting the plan's own assignments as it goes. The `ordered` / `sticky`
plans (`dispatch.admission`) place with the same rule.

Examples:
    >>> from maserve_prefect.dispatch.snapshot import Unit
    >>> from maserve_prefect.protocol.state import Lifecycle
    >>> snap = Snapshot(0.0, (Unit("b", "r", "m", 10, 1, ready_s=1.0),
    ...                       Unit("a", "r", "m", 10, 1, ready_s=1.0)), (),
    ...                 (ReplicaView("x", "m", Lifecycle.READY, 1),
    ...                  ReplicaView("y", "m", Lifecycle.READY, 0)))
    >>> [(s.unit_id, s.replica) for s in FcfsPlan().plan(snap).submits]
    [('a', 'y'), ('b', 'x')]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from maserve_prefect.dispatch.snapshot import Decisions, ReplicaView, Snapshot, Submit
from maserve_prefect.protocol.views import fcfs_order


def least_loaded(candidates: Iterable[ReplicaView], load: Mapping[str, int]) -> ReplicaView | None:
    """The candidate with room and the fewest outstanding requests in `load` (the snapshot's
    counts plus the plan's own assignments so far), ties by name; None if none has room.

    Examples:
        >>> from maserve_prefect.protocol.state import Lifecycle
        >>> vs = [ReplicaView(n, "m", Lifecycle.READY, max_outstanding=2) for n in ("b", "a")]
        >>> least_loaded(vs, {"a": 1, "b": 1}).name, least_loaded(vs, {"a": 2, "b": 2})
        ('a', None)
    """
    return min(
        (r for r in candidates if r.max_outstanding is None or load[r.name] < r.max_outstanding),
        key=lambda r: (load[r.name], r.name),
        default=None,
    )


class FcfsPlan:
    """First come, first served with least-loaded placement (see the module docstring)."""

    name = "fcfs"

    def plan(self, snapshot: Snapshot) -> Decisions:
        load = {r.name: r.num_outstanding for r in snapshot.replicas}
        accepting = [r for r in snapshot.replicas if r.accepting]
        submits = []
        for unit in fcfs_order(snapshot.ready, lambda u: u.ready_s, lambda u: u.unit_id):
            best = least_loaded((r for r in accepting if r.serves(unit.deployment)), load)
            if best is None:
                continue  # nothing can take it now; it stays ready for a later event
            load[best.name] += 1
            submits.append(Submit(unit.unit_id, best.name))
        return Decisions(submits=tuple(submits))
