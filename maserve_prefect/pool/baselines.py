"""Baseline pool plans in the same harness as `joint`: request-level lifecycle, three orders.

One idea: the baselines differ from the joint plan in *what they know*, not in the machinery —
they see the same `PoolSnapshot`, pass every load through the same `MemoryLedger` and never touch
leased replicas, but decide request by request: no fusion of the physical graph, no prefetch, no
lifecycle plan across workflows. Each adds only what its paper describes:

- **on demand** (all three): a ready request goes to an accepting replica of its deployment if
  one exists; otherwise, if no copy is loading or busy, its deployment is loaded for it — on the
  first device (pool order) with room, else the first where evicting least-recently-used idle,
  lease-free replicas makes room.
- `pool-fcfs` (request-level FCFS): requests in ready order; a submit goes to the replica with
  the fewest requests in flight; one copy per model (the plain reference).
- `parrot` (Parrot, OSDI'24): Semantic Variables expose which request's output feeds which, so
  requests are ordered by the application DAG — longest remaining critical path first, then
  more downstream units — and **dependent requests are chained**: a request whose output is
  the only input of a request of the same deployment keeps that consumer on its engine, so the
  consumer runs there the moment its input exists instead of re-queuing (`parrot_chain`; on
  this interface a `Grant` of the producer's replica to the chain, which the dispatcher submits
  to at once). Joins and fan-ins are dispatched by the order rule.
- `kairos` (Kairos, arXiv 2508.06948): a workflow-aware priority scheduler — requests of the
  workflow with the least remaining work first, then the earliest-arrived workflow — and a
  **memory-aware dispatcher**: each request goes to the replica whose free KV cache best fits
  its predicted demand (best fit: the least headroom that still holds the request's context,
  input + predicted output tokens), and waits at the dispatcher when no replica has room, so
  no instance is overloaded into preemption (`kv_best_fit`). Kairos loads no models; a new
  instance goes where it will have the most headroom (the device with the most free memory
  first), its memory-awareness applied to where instances live.
- `parrot` and `kairos` share the reactive scale-out rule of `pool.scale_out` (another copy of
  a model once its queue outlasts a load); neither paper loads models, so both get the same.

Examples:
    >>> from maserve_prefect.dispatch.plans import get_plan
    >>> [get_plan(n).name for n in ("pool-fcfs", "parrot", "kairos")]
    ['pool-fcfs', 'parrot', 'kairos']
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from maserve_prefect.dispatch.snapshot import Decisions, Snapshot
from maserve_prefect.pool.constructor import LifecycleOption, lifecycle_option
from maserve_prefect.pool.fusion import WorkItem
from maserve_prefect.pool.plan_round import Round
from maserve_prefect.pool.scale_out import scale_out
from maserve_prefect.pool.snapshot import PoolSnapshot, pool_snapshot
from maserve_prefect.pool.state import INF, ReplicaInfo
from maserve_prefect.pool.window import WindowUnit, WorkUnit


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


def on_demand_load(
    rd: Round, deployment: str, avoid: Collection[str] = (), most_free_first: bool = False
) -> LifecycleOption | None:
    """Where the baselines load `deployment`: the first device (pool order, or most free memory
    first; never one in `avoid`) with room, else the first where evicting least-recently-used
    idle replicas makes room; None if nowhere."""
    devices = [d for d in rd.state.device_names() if d not in avoid]
    if most_free_first:
        devices = sorted(devices, key=lambda d: (-rd.ledger.headroom(d, rd.now), d))
    for reclaim in (False, True):
        for dev in devices:
            opt = _option(rd, deployment, dev, reclaim)
            if opt is not None:
                return opt
    return None


def parrot_chain(unit: WorkUnit, units: Mapping[str, WorkUnit]) -> tuple[WorkUnit, ...]:
    """`unit` and the requests chained to it (Parrot's dependent requests): every consumer of
    the same deployment whose only input is a chain member's output, transitively, in
    breadth-first order (known units only).

    Examples:
        >>> a = WorkUnit("a", "r", "m", 1, 1, succs=("b", "c"))
        >>> b = WorkUnit("b", "r", "m", 1, 1, preds=("a",))
        >>> c = WorkUnit("c", "r", "other", 1, 1, preds=("a",))
        >>> [u.unit_id for u in parrot_chain(a, {"a": a, "b": b, "c": c})]
        ['a', 'b']
    """
    out = [unit]
    i = 0
    while i < len(out):
        for s in out[i].succs:
            v = units.get(s)
            if v is not None and v.preds == (out[i].unit_id,) and v.deployment == unit.deployment:
                out.append(v)
        i += 1
    return tuple(out)


def kv_headroom_tokens(rd: Round, r: ReplicaInfo) -> int:
    """Free KV tokens on `r`: its capacity less the contexts in flight and submitted to it
    this round."""
    used = sum(a.context_tokens for a in r.active)
    used += sum(rd.snap.units[s.unit_id].context_tokens for s in rd.submits if s.replica == r.name)
    return r.kv_capacity_tokens - used


def kv_best_fit(rd: Round, cands: list[ReplicaInfo], demand_tokens: int) -> ReplicaInfo | None:
    """Kairos's memory-aware choice: of the replicas whose free KV holds `demand_tokens`, the
    one with the least (best fit; ties by name); None when none has room."""
    fits = [(kv_headroom_tokens(rd, r), r.name, r) for r in cands]
    fits = [f for f in fits if f[0] >= demand_tokens]
    return min(fits, key=lambda f: (f[0], f[1]))[2] if fits else None


class RequestLevelPlan:
    """Shared body of the baselines: order requests, reuse, else load on demand with LRU."""

    name = "request-level"
    scale_out = False

    def order_key(self, snap: PoolSnapshot, w: WindowUnit) -> tuple[object, ...]:
        return (w.release_s, w.unit.unit_id)

    def item(self, snap: PoolSnapshot, w: WindowUnit) -> WorkItem:
        """The work a ready unit brings (just the unit; Parrot adds its chain)."""
        return WorkItem((w.unit,), w.release_s)

    def plan(self, snapshot: Snapshot) -> Decisions:
        snap = pool_snapshot(snapshot, self.name)
        rd = Round(snap)
        unserved: list[WorkItem] = []
        demanded: list[str] = []
        for w in sorted(snap.window.ready, key=lambda w: self.order_key(snap, w)):
            item = self.item(snap, w)
            demanded.append(item.deployment)
            replica = self.replica(rd, item)
            if replica is None:
                unserved.append(item)
            else:
                rd.submit(item, replica, grant=len(item.units) > 1)
        # Loads after submits, so that no eviction takes a replica a ready request just got.
        for item in unserved:
            if not rd.supply(item.deployment) and rd.slot_free_s(item.deployment) == INF:
                opt = self.load(rd, item.deployment)
                if opt is not None:
                    rd.take(opt, (item.head.unit_id,))
        if self.scale_out:
            scale_out(rd, demanded, self.load)
        return rd.decisions()

    def load(
        self, rd: Round, deployment: str, avoid: Collection[str] = ()
    ) -> LifecycleOption | None:
        """Where a new copy of `deployment` goes (`on_demand_load`)."""
        return on_demand_load(rd, deployment, avoid)

    def replica(self, rd: Round, item: WorkItem) -> ReplicaInfo | None:
        """The accepting replica with the fewest requests in flight (None: none accepts)."""
        cands = [r for r in rd.state.replicas_of(item.deployment) if rd.can_accept(r, item)]
        return min(cands, key=lambda r: (rd.batch[r.name][0], r.name)) if cands else None


class PoolFcfsPlan(RequestLevelPlan):
    """Request-level FCFS with on-demand loads and LRU eviction (module docstring)."""

    name = "pool-fcfs"


class ParrotPlan(RequestLevelPlan):
    """DAG-aware order (longest remaining critical path, then most downstream units),
    dependent-request chaining, reactive scale-out (module docstring)."""

    name = "parrot"
    scale_out = True

    def order_key(self, snap: PoolSnapshot, w: WindowUnit) -> tuple[object, ...]:
        return (-w.critical_path_s, -w.num_descendants, w.release_s, w.unit.unit_id)

    def item(self, snap: PoolSnapshot, w: WindowUnit) -> WorkItem:
        return WorkItem(parrot_chain(w.unit, snap.units), w.release_s)


class KairosPlan(RequestLevelPlan):
    """Workflow-aware priority (least remaining work, earliest workflow), memory-aware KV
    best-fit dispatch, reactive scale-out (module docstring)."""

    name = "kairos"
    scale_out = True

    def order_key(self, snap: PoolSnapshot, w: WindowUnit) -> tuple[object, ...]:
        root = w.unit.root_id
        remaining = snap.window.root_remaining_s.get(root, 0.0)
        arrival = snap.window.root_arrival_s.get(root, 0.0)
        return (remaining, arrival, root, w.release_s, w.unit.unit_id)

    def replica(self, rd: Round, item: WorkItem) -> ReplicaInfo | None:
        cands = [r for r in rd.state.replicas_of(item.deployment) if rd.can_accept(r, item)]
        return kv_best_fit(rd, cands, item.envelope.max_context_tokens)

    def load(
        self, rd: Round, deployment: str, avoid: Collection[str] = ()
    ) -> LifecycleOption | None:
        return on_demand_load(rd, deployment, avoid, most_free_first=True)
