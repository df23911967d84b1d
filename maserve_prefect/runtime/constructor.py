"""The constructor: fused chains, admission envelopes, and lifecycle alternatives with their memory.

One idea: a plan never reasons about single calls and single loads in isolation. Consecutive calls
of one deployment with nothing branching or joining between them form a *chain* that runs under
one grant (one placement, one lease) with an *envelope* — its largest context and its summed
runtime; demand for a deployment from many workflows is *coalesced* into one lifecycle action
(one load serves every root; request state stays per root); and every lifecycle alternative —
Load, Prefetch, Reclaim+Load, Reclaim+Prefetch — is checked against a `MemoryLedger` that walks
each device's memory through every predicted transition (in-flight loads and unloads, loads
waiting for their victims, this round's own decisions).

Fusion rule: `u → v` fuse iff `u`'s only successor is `v`, `v`'s only predecessor is `u`, both
belong to the same root and name the same deployment (identity = model + version + serving
config, so "same name" is "compatible config"). Fusion never crosses a branch or a join, and
every unit of a chain stays its own request with its own output and completion.

Victim order for a reclaim (only lease-free, idle replicas are candidates): redundant copies
first (the deployment has another replica), then replicas with no predicted next use (least
recently used first), then by how far the next use lies beyond the reload cost (most slack first).
A prefetch (speculative) may only reclaim redundant copies and replicas whose predicted next use
comes after the prefetched work plus their reload (`prefetch_victims`). What a reclaim costs the
victims' own work — each of their units still to start waits at least for a reload —
is `victim_delay_s`. A load may also wait for unloads already under way (`await_unloads`):
they end within one unload time, no later than a reclaim decided now, and take no victim.

Examples:
    >>> a = WorkUnit("a", "r", "m", 10, 5, succs=("b",))
    >>> b = WorkUnit("b", "r", "m", 20, 5, preds=("a",))
    >>> chains = fusible_chains({"a": a, "b": b})
    >>> chains["b"].unit_ids, envelope([a, b]).max_context_tokens
    (('a', 'b'), 25)
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from maserve_prefect.runtime.plans import Load, Unload
from maserve_prefect.runtime.pool_state import (
    INF,
    CostModel,
    PoolState,
    ReplicaInfo,
    ReplicaPhase,
)
from maserve_prefect.runtime.window import WorkUnit, topo_order

# ---------------------------------------------------------------------------------------------
# fusion and envelopes


@dataclass(frozen=True, slots=True)
class Chain:
    """A maximal fusible chain of units (head first)."""

    chain_id: str
    root_id: str
    deployment: str
    unit_ids: tuple[str, ...]

    def rest(self, unit_id: str) -> tuple[str, ...]:
        """`unit_id` and the chain members after it."""
        return self.unit_ids[self.unit_ids.index(unit_id) :]


def fusible(u: WorkUnit, v: WorkUnit) -> bool:
    """Whether `v` may run under `u`'s grant (module docstring)."""
    return (
        u.succs == (v.unit_id,)
        and v.preds == (u.unit_id,)
        and u.root_id == v.root_id
        and u.deployment == v.deployment
    )


def fusible_chains(units: Mapping[str, WorkUnit], enabled: bool = True) -> dict[str, Chain]:
    """Every unit's maximal chain (a singleton when fusion is off or nothing fuses).

    Raises:
        ConfigError: the DAG is malformed (see `window.topo_order`).
    """
    out: dict[str, Chain] = {}
    for uid in topo_order(units):
        if uid in out:
            continue
        members = [uid]
        while enabled:
            u = units[members[-1]]
            if len(u.succs) != 1 or not fusible(u, units[u.succs[0]]):
                break
            members.append(u.succs[0])
        head = units[uid]
        chain = Chain(uid, head.root_id, head.deployment, tuple(members))
        for m in members:
            out[m] = chain
    return out


@dataclass(frozen=True, slots=True)
class Envelope:
    """What a replica must admit to run a chain: its largest context and its length."""

    max_context_tokens: int
    max_input_len: int
    max_output_len: int
    num_units: int


def envelope(units: Sequence[WorkUnit]) -> Envelope:
    """The admission envelope of units that run one after another on one replica."""
    return Envelope(
        max(u.context_tokens for u in units),
        max(u.input_len for u in units),
        max(u.max_tokens for u in units),
        len(units),
    )


@dataclass(frozen=True, slots=True)
class WorkItem:
    """A placeable piece of ready work: a unit and the rest of its fused chain.

    Attributes:
        units: head first; all share the head's deployment.
        release_s: when the head became ready (or is predicted to, for near-ready work).
    """

    units: tuple[WorkUnit, ...]
    release_s: float

    @property
    def head(self) -> WorkUnit:
        return self.units[0]

    @property
    def deployment(self) -> str:
        return self.units[0].deployment

    @property
    def unit_ids(self) -> tuple[str, ...]:
        return tuple(u.unit_id for u in self.units)

    @property
    def envelope(self) -> Envelope:
        return envelope(self.units)

    def runtime_s(self, costs: CostModel, model: str, gpu: str, batch: int = 1) -> float:
        """Summed predicted runtime of the chain on `gpu` (members run one after another)."""
        return sum(
            costs.runtime_s(model, gpu, batch, u.input_len, u.max_tokens) for u in self.units
        )


def work_item(
    unit: WorkUnit,
    release_s: float,
    units: Mapping[str, WorkUnit],
    chains: Mapping[str, Chain] | None,
) -> WorkItem:
    """The work item headed by `unit`: its chain from `unit` on (just `unit` without chains)."""
    chain = chains.get(unit.unit_id) if chains else None
    ids = chain.rest(unit.unit_id) if chain else (unit.unit_id,)
    return WorkItem((unit, *(units[i] for i in ids[1:])), release_s)


@dataclass(frozen=True, slots=True)
class Demand:
    """Coalesced demand for one deployment: the work items of every root that need it."""

    deployment: str
    items: tuple[WorkItem, ...]

    @property
    def roots(self) -> tuple[str, ...]:
        return tuple(sorted({i.head.root_id for i in self.items}))


def coalesce(items: Iterable[WorkItem]) -> list[Demand]:
    """Group work items by deployment (one lifecycle action can serve them all), deployment
    order, items kept in their given order.

    Examples:
        >>> a, b = WorkUnit("a", "r1", "m", 1, 1), WorkUnit("b", "r2", "m", 1, 1)
        >>> [d.roots for d in coalesce([WorkItem((a,), 0.0), WorkItem((b,), 0.0)])]
        [('r1', 'r2')]
    """
    groups: dict[str, list[WorkItem]] = {}
    for item in items:
        groups.setdefault(item.deployment, []).append(item)
    return [Demand(d, tuple(groups[d])) for d in sorted(groups)]


# ---------------------------------------------------------------------------------------------
# memory over predicted time


class MemoryLedger:
    """Each device's memory as a step function of predicted time.

    Built from a `PoolState`: what every replica holds now, minus in-flight unloads at their
    predicted end, plus loads waiting for their victims at their predicted start. Plans add
    their own decisions as they go (`add`, `release`) and ask `fits`.

    A release at exactly the instant of an addition is only trusted when the caller names it
    (the addition's own victims, whose unload end starts it); otherwise the ledger assumes the
    addition may come first, which keeps the check conservative.
    """

    def __init__(self, state: PoolState) -> None:
        self.capacity = {d.name: d.capacity_bytes for d in state.devices}
        self._adds: dict[str, list[tuple[float, int]]] = {d: [] for d in self.capacity}
        self._rels: dict[str, list[tuple[float, int, str]]] = {d: [] for d in self.capacity}
        now = state.now_s
        for r in state.replicas:
            if r.held_bytes > 0:
                self.add(r.device, -INF, r.held_bytes)
            if r.phase is ReplicaPhase.UNLOADING:
                self.release(r.device, max(r.ready_s, now), r.held_bytes, r.name)
        for p in state.planned:
            self.add(p.device, max(p.start_s, now), p.footprint_bytes)

    def copy(self) -> MemoryLedger:
        new = MemoryLedger.__new__(MemoryLedger)
        new.capacity = self.capacity
        new._adds = {d: list(v) for d, v in self._adds.items()}
        new._rels = {d: list(v) for d, v in self._rels.items()}
        return new

    def add(self, device: str, at_s: float, nbytes: int) -> None:
        """`nbytes` held on `device` from `at_s` on."""
        bisect.insort(self._adds[device], (at_s, nbytes))

    def release(self, device: str, at_s: float, nbytes: int, tag: str = "") -> None:
        """`nbytes` freed on `device` at `at_s` (by the replica named `tag`)."""
        bisect.insort(self._rels[device], (at_s, nbytes, tag))

    def usage_at(self, device: str, t: float, trusted: Iterable[str] = ()) -> int:
        """Bytes held at `t`, counting additions at `t` and releases before it (or at it, when
        their tag is trusted)."""
        ok = set(trusted)
        held = sum(b for at, b in self._adds[device] if at <= t)
        freed = sum(b for at, b, tag in self._rels[device] if at < t or (at == t and tag in ok))
        return held - freed

    def headroom(self, device: str, start_s: float, trusted: Iterable[str] = ()) -> int:
        """The least free memory on `device` at any transition from `start_s` on."""
        cap = self.capacity[device]
        trusted = tuple(trusted)
        points = [t for t, _ in self._adds[device] if t > start_s]
        free = cap - self.usage_at(device, start_s, trusted)
        for t in points:
            free = min(free, cap - self.usage_at(device, t))
        return free

    def fits(self, device: str, nbytes: int, start_s: float, trusted: Iterable[str] = ()) -> bool:
        """Whether `nbytes` more from `start_s` on keeps every later transition within capacity."""
        return self.headroom(device, start_s, trusted) >= nbytes

    def releases(self, device: str, from_s: float) -> list[tuple[float, str]]:
        """(time, tag) of the releases on `device` at or after `from_s`, in time order."""
        return [(at, tag) for at, _, tag in self._rels[device] if at >= from_s]


# ---------------------------------------------------------------------------------------------
# lifecycle alternatives


class OptionKind(Enum):
    """The lifecycle alternatives of the constructor."""

    LOAD = "load"
    PREFETCH = "prefetch"
    RECLAIM_LOAD = "reclaim+load"
    RECLAIM_PREFETCH = "reclaim+prefetch"

    @property
    def prefetch(self) -> bool:
        return self in (OptionKind.PREFETCH, OptionKind.RECLAIM_PREFETCH)


@dataclass(frozen=True, slots=True)
class LifecycleOption:
    """One way to get a replica of `deployment` onto `device`.

    Attributes:
        victims: replicas unloaded first (the load starts when the last unload ends).
        victim_end_s: predicted end of each victim's unload.
        start_s / ready_s: predicted load start and end.
        overhead_s: lifecycle cost: the load plus the reload time of victims with a known
            next use.
        after: unloads already under way (not victims of this option) that the load waits for:
            it starts when their memory is back (`start_s`).
    """

    kind: OptionKind
    deployment: str
    device: str
    victims: tuple[ReplicaInfo, ...]
    victim_end_s: tuple[float, ...]
    start_s: float
    ready_s: float
    footprint_bytes: int
    overhead_s: float
    after: tuple[str, ...] = ()

    def decisions(self, units: tuple[str, ...]) -> tuple[tuple[Unload, ...], Load]:
        """The unloads and the load this option commits to (the load waits for the unloads,
        its own victims' and those under way that it counts on)."""
        names = tuple(v.name for v in self.victims)
        unloads = tuple(Unload(n, self.deployment) for n in names)
        wait = names + tuple(n for n in self.after if n not in names)
        return unloads, Load(self.deployment, self.device, wait, self.kind.prefetch, units)

    def commit(self, ledger: MemoryLedger) -> None:
        """Write this option's unloads and load into `ledger`."""
        for v, end in zip(self.victims, self.victim_end_s, strict=True):
            ledger.release(self.device, end, v.held_bytes, v.name)
        ledger.add(self.device, self.start_s, self.footprint_bytes)


def is_redundant(state: PoolState, r: ReplicaInfo, leaving: set[str]) -> bool:
    """Whether another replica of `r`'s deployment (not in `leaving`, not unloading) exists or a
    load of it is planned: reclaiming `r` leaves its work a copy."""
    for o in state.replicas:
        if o.deployment == r.deployment and o.name != r.name and o.name not in leaving:
            if o.phase is not ReplicaPhase.UNLOADING:
                return True
    return any(p.deployment == r.deployment for p in state.planned)


def victim_order(
    state: PoolState,
    device: str,
    next_use_s: Mapping[str, float],
    costs: CostModel,
    exclude: Iterable[str] = (),
) -> list[ReplicaInfo]:
    """Reclaimable replicas on `device` in eviction order (module docstring)."""
    skip = set(exclude)
    gpu = state.device(device).gpu
    now = state.now_s

    def key(r: ReplicaInfo) -> tuple[int, int, float, float, str]:
        if is_redundant(state, r, skip):
            return (0, 0, 0.0, r.last_used_s, r.name)
        use = next_use_s.get(r.deployment)
        if use is None:
            return (1, 0, 0.0, r.last_used_s, r.name)
        reload = costs.load_s(state.deployment(r.deployment).model, gpu)
        return (1, 1, -((use - now) - reload), r.last_used_s, r.name)

    cands = [
        r for r in state.replicas_on(device) if r.name not in skip and state.reclaimable(r.name)
    ]
    return sorted(cands, key=key)


def prefetch_victims(
    state: PoolState,
    device: str,
    next_use_s: Mapping[str, float],
    costs: CostModel,
    release_s: float,
    exclude: Iterable[str] = (),
) -> list[ReplicaInfo]:
    """Victims a speculative prefetch may take, in `victim_order`: redundant copies, and replicas
    whose known next use lies beyond `release_s` plus their reload time. A replica with no
    predicted use is kept: arrivals the window cannot see may need it, and a prefetch is a bet.
    """
    skip = set(exclude)
    gpu = state.device(device).gpu
    out = []
    for r in victim_order(state, device, next_use_s, costs, skip):
        use = next_use_s.get(r.deployment)
        reload = costs.load_s(state.deployment(r.deployment).model, gpu)
        if is_redundant(state, r, skip) or (use is not None and use >= release_s + reload):
            out.append(r)
    return out


def reload_overhead_s(
    state: PoolState,
    victims: Sequence[ReplicaInfo],
    next_use_s: Mapping[str, float],
    costs: CostModel,
) -> float:
    """Reload time of victims that will be needed again (and have no other copy)."""
    total = 0.0
    for v in victims:
        if v.deployment in next_use_s and not is_redundant(state, v, {x.name for x in victims}):
            gpu = state.device(v.device).gpu
            total += costs.load_s(state.deployment(v.deployment).model, gpu)
    return total


def _after_unloads(
    ledger: MemoryLedger, device: str, nbytes: int, now: float
) -> tuple[float, tuple[str, ...]] | None:
    """The earliest end of an unload already under way (or decided this round) after which
    `nbytes` fit on `device`, and the unloads it waits for; None if none does. Such unloads end
    within one unload time, no later than a reclaim decided now could free memory."""
    names: list[str] = []
    for at, tag in ledger.releases(device, now):
        if tag and tag not in names:
            names.append(tag)
        if ledger.fits(device, nbytes, at, names):
            return at, tuple(names)
    return None


def victim_delay_s(
    state: PoolState,
    victims: Sequence[ReplicaInfo],
    pending: Mapping[str, Sequence[float]],
    costs: CostModel,
    leaving: Iterable[str] = (),
) -> float:
    """Predicted unit-seconds of delay that reclaiming `victims` puts on their own work.

    A victim whose deployment keeps another copy costs nothing. Otherwise every pending unit of
    its deployment (`pending`: deployment -> release times of its ready and near-ready units)
    waits at least until a reload could end — the victim's unload plus a load of its deployment
    on its own GPU — instead of running at its release. A lower estimate: the reload also needs
    memory somewhere, which this does not charge.

    Examples:
        >>> victim_delay_s(PoolState(0.0, (), ()), [], {}, None)  # type: ignore[arg-type]
        0.0
    """
    gone = {v.name for v in victims} | set(leaving)
    now = state.now_s
    total = 0.0
    for v in victims:
        releases = pending.get(v.deployment, ())
        if not releases or is_redundant(state, v, gone):
            continue
        gpu = state.device(v.device).gpu
        back = now + v.unload_s + costs.load_s(state.deployment(v.deployment).model, gpu)
        total += sum(max(back - max(t, now), 0.0) for t in releases)
    return total


def lifecycle_option(
    state: PoolState,
    ledger: MemoryLedger,
    deployment: str,
    device: str,
    costs: CostModel,
    next_use_s: Mapping[str, float],
    *,
    prefetch: bool = False,
    exclude: Iterable[str] = (),
    protect_before_s: float = -INF,
    allow_reclaim: bool = True,
    victims: Sequence[ReplicaInfo] | None = None,
    await_unloads: bool = False,
) -> LifecycleOption | None:
    """The cheapest way to load `deployment` on `device`: into free memory, else (with
    `await_unloads`) once unloads already under way have freed enough, else after reclaiming
    victims in `victim_order`; None when none fits.

    Args:
        exclude: replicas that must not be reclaimed (already chosen or planned on this round).
        protect_before_s: never reclaim a replica whose deployment is needed before this time
            (a prefetch must not evict something needed sooner than what it prefetches).
        allow_reclaim: only consider free memory.
        victims: candidates in the order to reclaim them (default: `victim_order`).
        await_unloads: consider waiting for unloads under way (they end within one unload
            time, no later than a reclaim decided now) before reclaiming anything.
    """
    fit = state.fit(deployment, device)
    if fit is None:
        return None
    now = state.now_s
    gpu = state.device(device).gpu
    load_s = costs.load_s(state.deployment(deployment).model, gpu)
    plain = OptionKind.PREFETCH if prefetch else OptionKind.LOAD
    if ledger.fits(device, fit.footprint_bytes, now):
        return LifecycleOption(
            plain, deployment, device, (), (), now, now + load_s, fit.footprint_bytes, load_s
        )
    waiting = _after_unloads(ledger, device, fit.footprint_bytes, now) if await_unloads else None
    if waiting is not None:
        start, names = waiting
        return LifecycleOption(
            plain, deployment, device, (), (), start, start + load_s, fit.footprint_bytes,
            load_s, names,
        )  # fmt: skip
    if not allow_reclaim:
        return None
    kind = OptionKind.RECLAIM_PREFETCH if prefetch else OptionKind.RECLAIM_LOAD
    trial = ledger.copy()
    skip = set(exclude)
    order = victim_order(state, device, next_use_s, costs, skip) if victims is None else victims
    taken: list[ReplicaInfo] = []
    for v in order:
        if next_use_s.get(v.deployment, INF) < protect_before_s:
            continue
        if v.device != device or v.name in skip or not state.reclaimable(v.name):
            continue
        taken.append(v)
        trial.release(device, now + v.unload_s, v.held_bytes, v.name)
        start = now + max(x.unload_s for x in taken)
        if trial.fits(device, fit.footprint_bytes, start, [x.name for x in taken]):
            overhead = load_s + reload_overhead_s(state, taken, next_use_s, costs)
            ends = tuple(now + x.unload_s for x in taken)
            return LifecycleOption(
                kind,
                deployment,
                device,
                tuple(taken),
                ends,
                start,
                start + load_s,
                fit.footprint_bytes,
                overhead,
            )
    return None
