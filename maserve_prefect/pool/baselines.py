"""Baseline pool plans in the same harness as `joint`: request-level lifecycle, three orders.

One idea: the baselines differ from the joint plan in *what they know*, not in the machinery —
they see the same `PoolSnapshot`, pass every load through the same `MemoryLedger` and never touch
leased replicas, but decide request by request: no fusion, no grants, no prefetch, no coalescing
beyond "a replica of this deployment is already loading". A ready request is sent to an accepting
replica of its deployment if one exists; otherwise, if none is loading, its deployment is loaded
for it, evicting least-recently-used idle replicas when memory is short.

- `pool-fcfs` (request-level FCFS): requests in ready order; loads go to the first device (pool
  order) with room, else the first device where LRU eviction makes room; submits go to the
  replica with the fewest requests in flight.
- `parrot` (Parrot-like, dependency-aware): requests on the longest remaining critical path of
  their DAG first, then with more downstream units; otherwise as `pool-fcfs`.
- `kairos` (Kairos-like, workflow-aware + memory-aware): requests of the workflow with the least
  remaining work first, then the earliest-arrived workflow; loads and submits go to the device
  with the most free memory that fits.

Examples:
    >>> from maserve_prefect.dispatch.plans import get_plan
    >>> [get_plan(n).name for n in ("pool-fcfs", "parrot", "kairos")]
    ['pool-fcfs', 'parrot', 'kairos']
"""

from __future__ import annotations

from collections.abc import Callable

from maserve_prefect.dispatch.snapshot import Decisions, Snapshot
from maserve_prefect.pool.constructor import LifecycleOption, lifecycle_option
from maserve_prefect.pool.fusion import WorkItem
from maserve_prefect.pool.plan_round import Round
from maserve_prefect.pool.snapshot import PoolSnapshot, pool_snapshot
from maserve_prefect.pool.state import INF, ReplicaInfo
from maserve_prefect.pool.window import WindowUnit

OrderKey = Callable[[PoolSnapshot, WindowUnit], tuple[object, ...]]


def _lru(rd: Round, device: str) -> list[ReplicaInfo]:
    cands = [
        r
        for r in rd.state.replicas_on(device)
        if r.name not in rd.exclude and rd.state.reclaimable(r.name)
    ]
    return sorted(cands, key=lambda r: (r.last_used_s, r.name))


def _option(rd: Round, deployment: str, device: str, reclaim: bool) -> LifecycleOption | None:
    return lifecycle_option(
        rd.state,
        rd.ledger,
        deployment,
        device,
        rd.costs,
        rd.snap.window.next_use_s,
        exclude=rd.exclude,
        allow_reclaim=reclaim,
        victims=_lru(rd, device) if reclaim else (),
    )


class RequestLevelPlan:
    """Shared body of the baselines: order requests, reuse, else load on demand with LRU."""

    name = "request-level"
    most_free_memory = False

    def order_key(self, snap: PoolSnapshot, w: WindowUnit) -> tuple[object, ...]:
        return (w.release_s, w.unit.unit_id)

    def plan(self, snapshot: Snapshot) -> Decisions:
        snap = pool_snapshot(snapshot, self.name)
        rd = Round(snap)
        unserved: list[WorkItem] = []
        for w in sorted(snap.window.ready, key=lambda w: self.order_key(snap, w)):
            item = WorkItem((w.unit,), w.release_s)
            replica = self._replica(rd, item)
            if replica is None:
                unserved.append(item)
            else:
                rd.submit(item, replica, grant=False)
        # Loads after submits, so that no eviction takes a replica a ready request just got.
        for item in unserved:
            if not rd.supply(item.deployment) and rd.slot_free_s(item.deployment) == INF:
                opt = self._load(rd, item.deployment)
                if opt is not None:
                    rd.take(opt, (item.head.unit_id,))
        return rd.decisions()

    def _replica(self, rd: Round, item: WorkItem) -> ReplicaInfo | None:
        cands = [r for r in rd.state.replicas_of(item.deployment) if rd.can_accept(r, item)]
        if not cands:
            return None
        if self.most_free_memory:
            return min(cands, key=lambda r: (-rd.ledger.headroom(r.device, rd.now), r.name))
        return min(cands, key=lambda r: (rd.batch[r.name][0], r.name))

    def _load(self, rd: Round, deployment: str) -> LifecycleOption | None:
        devices = rd.state.device_names()
        if self.most_free_memory:
            devices = sorted(devices, key=lambda d: (-rd.ledger.headroom(d, rd.now), d))
        for reclaim in (False, True):
            for dev in devices:
                opt = _option(rd, deployment, dev, reclaim)
                if opt is not None:
                    return opt
        return None


class PoolFcfsPlan(RequestLevelPlan):
    """Request-level FCFS with on-demand loads and LRU eviction (module docstring)."""

    name = "pool-fcfs"


class ParrotPlan(RequestLevelPlan):
    """Dependency-aware order: longest remaining critical path, then most downstream units."""

    name = "parrot"

    def order_key(self, snap: PoolSnapshot, w: WindowUnit) -> tuple[object, ...]:
        return (-w.critical_path_s, -w.num_descendants, w.release_s, w.unit.unit_id)


class KairosPlan(RequestLevelPlan):
    """RootDag-aware order (least remaining work, earliest workflow) + most-free-memory
    placement."""

    name = "kairos"
    most_free_memory = True

    def order_key(self, snap: PoolSnapshot, w: WindowUnit) -> tuple[object, ...]:
        root = w.unit.root_id
        remaining = snap.window.root_remaining_s.get(root, 0.0)
        arrival = snap.window.root_arrival_s.get(root, 0.0)
        return (remaining, arrival, root, w.release_s, w.unit.unit_id)
