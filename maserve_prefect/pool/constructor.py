"""The constructor: lifecycle alternatives for a deployment's demand, checked against memory.

One idea: a plan never reasons about single loads in isolation. Every lifecycle alternative —
Load, Prefetch, Reclaim+Load, Reclaim+Prefetch — is checked against a `MemoryLedger`
(`memory_ledger`) that walks each device's memory through every predicted transition (in-flight
loads and unloads, loads waiting for their victims, this round's own decisions). The demand it
serves comes as fused chains coalesced per deployment (`fusion`).

Victim order for a reclaim (only lease-free, idle replicas are candidates): redundant copies
first (the deployment has another replica), then replicas with no predicted next use (least
recently used first), then by how far the next use lies beyond the reload cost (most slack first).
A prefetch (speculative) may only reclaim redundant copies and replicas whose predicted next use
comes after the prefetched work plus their reload (`prefetch_victims`). What a reclaim costs the
victims' own work — each of their units still to start waits at least for a reload —
is `victim_delay_s`. A load may also wait for unloads already under way (`await_unloads`):
they end within one unload time, no later than a reclaim decided now, and take no victim.

Examples:
    >>> from maserve_prefect.engines.sim.pool.device import Deployment
    >>> from maserve_prefect.pool.state import DeviceInfo, RooflineCostModel, deployment_info
    >>> gpu = DeviceInfo("A100-40GB:0", "A100-40GB", 40 << 30)
    >>> info = deployment_info(Deployment("m", "Qwen3-8B", kv_cache_bytes=2 << 30), ["A100-40GB"])
    >>> s = PoolState(0.0, (gpu,), (info,))
    >>> opt = lifecycle_option(s, MemoryLedger(s), "m", gpu.name, RooflineCostModel(2 << 30), {})
    >>> opt.kind.value, opt.victims, opt.start_s
    ('load', (), 0.0)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from maserve_prefect.dispatch.snapshot import Load, Unload
from maserve_prefect.pool.memory_ledger import MemoryLedger
from maserve_prefect.pool.state import (
    INF,
    CostModel,
    PoolState,
    ReplicaInfo,
)
from maserve_prefect.protocol.state import Lifecycle


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
            if o.lifecycle is not Lifecycle.UNLOADING:
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
        victims: candidates in the order to reclaim them (default: `victim_order`); a replica of
            `deployment` itself is never one (unloading a copy to load the same deployment on
            the same device only churns).
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
        if v.deployment == deployment:
            continue  # reclaiming a copy of what is loaded, to load it again, gains nothing
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
