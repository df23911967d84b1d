"""The joint pool plan: lifecycle, replica, device and order chosen together, one prefix at a time.

One idea: each call is a pure, greedy pass over an extended snapshot (`PoolSnapshot`: pool state +
window + predictions) that commits only what can start now, and every event replans:

1. Ready work items (a unit and the rest of its fused chain) are ranked by priority with aging
   (a unit gains one priority class per `aging_s` waited), then ready time, then id.
2. Each item first *reuses* an accepting resident replica of its deployment (earliest predicted
   completion; batch limit, KV envelope and request memory checked) and gets a `Grant` for its
   chain. A unit that a standing grant binds goes to that replica only.
3. The rest is coalesced per deployment and gets lifecycle options on every device, scale-out
   included: Load into free memory, Load once unloads already under way end, or Reclaim+Load
   (victims lease-free and idle: redundant copies first, then most distant next use beyond
   their reload, `constructor.victim_order`). An option is a candidate only if it has a
   predicted *benefit*: every unmet item is list-scheduled on the supply there is — a serving
   replica frees a slot as each request of its batch ends (its queue drains, this round's
   submits included), a loading, planned or just-decided copy opens as many slots as its memory
   allows when its load ends — with and without the new copy, and the completion time it saves
   (unit-seconds) must exceed the delay that reclaiming its victims puts on their own work still
   to start (`constructor.victim_delay_s`); work with no supply at all gains without bound.
   Candidates are ranked by the key: ready-work coverage per priority class (most urgent class
   first), counted as the predicted work the covered units head — each unit and everything
   after it in its DAG, so a load that unblocks more work covers more — then predicted
   completion (completions within `tie_s` of the earliest count as equal: that is below what
   the predictions resolve), then lifecycle overhead, then best fit (least memory left on the
   device, so that large holes stay for large models). The best is committed to the memory
   ledger and the search repeats. An option that waits for unloads under way decides nothing
   yet: its memory is held for the round, and the unloads' end is an event that replans.
4. Only when no ready action can advance — no lifecycle action for ready work was taken or
   held this round — a deployment of near-ready work with no replica is *prefetched* if its
   predicted release is within load time + `prefetch_slack_s` (ranked by priority, then
   release — timely first — then overhead). A prefetch evicts only redundant copies and
   replicas predicted to be needed after the prefetched work plus their reload
   (`constructor.prefetch_victims`), and never memory a held load counts on.

Every load, reclaim and request goes through `MemoryLedger.fits` at every predicted transition,
victims are lease-free and idle, and committed work (requests in flight, granted chains) is never
moved or reclaimed — so replanning after an early or late completion keeps it.

Examples:
    >>> from maserve_prefect.runtime.plans import get_plan
    >>> get_plan("joint").name
    'joint'
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from maserve_prefect.errors import ConfigError
from maserve_prefect.runtime.constructor import (
    Chain,
    LifecycleOption,
    MemoryLedger,
    WorkItem,
    coalesce,
    lifecycle_option,
    prefetch_victims,
    victim_delay_s,
    work_item,
)
from maserve_prefect.runtime.plans import (
    Decisions,
    Grant,
    Load,
    Snapshot,
    Submit,
    Unload,
    register_plan,
)
from maserve_prefect.runtime.pool_state import (
    INF,
    CostModel,
    PoolState,
    ReplicaInfo,
    ReplicaPhase,
)
from maserve_prefect.runtime.window import Window, WindowUnit, WorkUnit


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """Knobs of the pool plans (ablations switch fusion and prefetch off).

    Attributes:
        fusion: run a fused chain under one grant (off: every unit is placed alone).
        prefetch: allow loading deployments of near-ready work ahead of time.
        aging_s: a waiting unit gains one priority class per `aging_s` seconds waited.
        prefetch_slack_s: prefetch once the release is within load time + this.
        tie_s: completions closer than this count as equal when ranking lifecycle options.
    """

    fusion: bool = True
    prefetch: bool = True
    aging_s: float = 30.0
    prefetch_slack_s: float = 5.0
    tie_s: float = 2.0


@dataclass(frozen=True, slots=True)
class PoolSnapshot(Snapshot):
    """A `Snapshot` extended with the pool state, the window and the predictions.

    Attributes:
        pool: devices, replicas, leases, grants and planned loads at `now_s`.
        window: ready / near-ready units with predicted releases.
        units: the active roots' DAG (every unit of a root that arrived and is not finished).
        costs: runtime / memory / load predictions.
        chains: each unit's fused chain (`constructor.fusible_chains`).
    """

    pool: PoolState
    window: Window
    units: Mapping[str, WorkUnit]
    costs: CostModel
    chains: Mapping[str, Chain] = field(default_factory=dict)
    options: PlanOptions = PlanOptions()


def pool_snapshot(snapshot: Snapshot, plan: str) -> PoolSnapshot:
    """`snapshot` as a `PoolSnapshot`.

    Raises:
        ConfigError: a plain dispatcher snapshot was given to a pool plan.
    """
    if not isinstance(snapshot, PoolSnapshot):
        raise ConfigError(
            f"plan {plan!r} needs a PoolSnapshot (pool state + window + predictions); run it "
            "under the pool runtime (runtime.pool_exec) or a dispatcher that builds one"
        )
    return snapshot


@dataclass(frozen=True, slots=True)
class Slots:
    """One replica's batch slots for queued work: the GPU it runs on, when each slot frees."""

    gpu: str
    free_s: tuple[float, ...]


class Round:
    """Mutable working state of one plan call; `decisions()` freezes what it committed."""

    def __init__(self, snap: PoolSnapshot) -> None:
        self.snap = snap
        self.state: PoolState = snap.pool
        self.costs = snap.costs
        self.now = snap.now_s
        self.ledger = MemoryLedger(snap.pool)
        self.exclude: set[str] = set()  # replicas this round reclaims or hands work to
        self.leaving: set[str] = set()  # replicas this round reclaims
        self.batch: dict[str, tuple[int, int, int]] = {}  # replica -> (n, max in, max out)
        self.submits: list[Submit] = []
        self.grants: list[Grant] = []
        self.loads: list[Load] = []
        self.unloads: list[Unload] = []
        self.new_supply: dict[str, list[tuple[float, int]]] = {}
        self.new_copies: dict[str, list[tuple[str, float]]] = {}  # deployment -> (device, ready)
        self.ends: dict[str, list[float]] = {}  # replica -> this round's submits' predicted ends
        self.deferred: list[LifecycleOption] = []  # loads waiting for unloads under way
        for r in self.state.replicas:
            n = len(r.active)
            self.batch[r.name] = (
                n,
                max((a.input_len for a in r.active), default=0),
                max((a.max_tokens for a in r.active), default=0),
            )

    def model(self, deployment: str) -> str:
        return self.state.deployment(deployment).model

    def gpu(self, device: str) -> str:
        return self.state.device(device).gpu

    # -- requests --------------------------------------------------------------------------

    def _held(self, r: ReplicaInfo, n: int, max_in: int, max_out: int) -> int:
        if n == 0:
            return r.footprint_bytes
        peak = self.costs.peak_mem_bytes(
            self.model(r.deployment), self.gpu(r.device), n, max_in, max_out
        )
        return max(r.footprint_bytes, peak)

    def request_delta(self, r: ReplicaInfo, item: WorkItem) -> int:
        """Extra device bytes the replica holds once `item`'s head runs beside its batch."""
        n, mi, mo = self.batch[r.name]
        env = item.envelope
        after = self._held(r, n + 1, max(mi, env.max_input_len), max(mo, env.max_output_len))
        return max(after - self._held(r, n, mi, mo), 0)

    def can_accept(self, r: ReplicaInfo, item: WorkItem) -> bool:
        """Resident, accepting, below its batch limit, KV envelope fits, memory fits."""
        if not r.serving or item.deployment != r.deployment or r.name in self.leaving:
            return False
        if self.batch[r.name][0] >= r.max_num_seqs:
            return False
        if item.envelope.max_context_tokens > r.kv_capacity_tokens:
            return False
        delta = self.request_delta(r, item)
        return delta == 0 or self.ledger.fits(r.device, delta, self.now)

    def completion_on(self, r: ReplicaInfo, item: WorkItem) -> float:
        n = self.batch[r.name][0] + 1
        return self.now + item.runtime_s(
            self.costs, self.model(r.deployment), self.gpu(r.device), n
        )

    def submit(self, item: WorkItem, r: ReplicaInfo, grant: bool) -> None:
        """Send `item`'s head to `r` now (and grant it the chain)."""
        delta = self.request_delta(r, item)
        if delta:
            self.ledger.add(r.device, self.now, delta)
        end = self.completion_on(r, item)
        n, mi, mo = self.batch[r.name]
        env = item.envelope
        self.batch[r.name] = (n + 1, max(mi, env.max_input_len), max(mo, env.max_output_len))
        self.ends.setdefault(r.name, []).append(end)
        self.exclude.add(r.name)
        self.submits.append(Submit(item.head.unit_id, r.name))
        if grant:
            self.grants.append(Grant(r.name, item.unit_ids))

    # -- lifecycle -------------------------------------------------------------------------

    def take(self, opt: LifecycleOption, units: Sequence[str]) -> None:
        """Commit a lifecycle option serving `units`."""
        unloads, load = opt.decisions(tuple(units))
        opt.commit(self.ledger)
        self.unloads.extend(unloads)
        self.loads.append(load)
        self.exclude.update(v.name for v in opt.victims)
        self.leaving.update(v.name for v in opt.victims)
        fit = self.state.fit(opt.deployment, opt.device)
        cap = fit.max_num_seqs if fit else 1
        self.new_supply.setdefault(opt.deployment, []).append((opt.ready_s, cap))
        self.new_copies.setdefault(opt.deployment, []).append((opt.device, opt.ready_s))

    def defer(self, opt: LifecycleOption) -> None:
        """Hold `opt`'s memory and count it as supply, but decide nothing now: it waits for
        unloads under way (`opt.after`), whose end is an event that replans, and the load
        that replan makes needs no victim."""
        opt.commit(self.ledger)
        self.deferred.append(opt)
        self.new_supply.setdefault(opt.deployment, []).append((opt.ready_s, 1))
        self.new_copies.setdefault(opt.deployment, []).append((opt.device, opt.ready_s))

    def leftover_bytes(self, opt: LifecycleOption) -> int:
        """Memory left on the option's device once it has loaded (best-fit tie-breaker)."""
        cap = self.ledger.capacity[opt.device]
        used = self.ledger.usage_at(opt.device, opt.start_s) - sum(
            v.held_bytes for v in opt.victims
        )
        return cap - used - opt.footprint_bytes

    def supply(self, deployment: str) -> list[tuple[float, int]]:
        """(ready time, batch limit) of replicas of `deployment` on their way (not resident)."""
        out = list(self.new_supply.get(deployment, ()))
        for r in self.state.replicas_of(deployment):
            if r.phase is ReplicaPhase.LOADING:
                out.append((max(r.ready_s, self.now), r.max_num_seqs))
        for p in self.state.planned:
            if p.deployment == deployment:
                fit = self.state.fit(deployment, p.device)
                out.append((p.ready_s, fit.max_num_seqs if fit else 1))
        return sorted(out)

    def batch_cap(self, deployment: str, device: str, items: Sequence[WorkItem], spare: int) -> int:
        """How many of `items` a fresh replica of `deployment` on `device` can run at once:
        its batch limit, and no more than the request memory beyond its footprint that `spare`
        bytes allow (predicted peak memory grows with the batch)."""
        fit = self.state.fit(deployment, device)
        if fit is None or not items:
            return 0
        top = min(fit.max_num_seqs, len(items))
        model, gpu = self.model(deployment), self.gpu(device)
        max_in = max(it.envelope.max_input_len for it in items)
        max_out = max(it.envelope.max_output_len for it in items)

        def ok(n: int) -> bool:
            peak = self.costs.peak_mem_bytes(model, gpu, n, max_in, max_out)
            return peak - fit.footprint_bytes <= spare

        lo, hi = 1, top  # at least one request runs: admission counts it then
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if ok(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def supply_slots(self, deployment: str, items: Sequence[WorkItem]) -> list[Slots]:
        """Where `items` of `deployment`, which no replica accepts now, can run next, per
        replica: a serving one frees a slot as each request of its batch ends (this round's
        submits included: its queue drains); a loading, planned or just-decided copy opens as
        many slots as its batch cap allows (`batch_cap`) when its load ends. Replicas this
        round reclaims are left out."""
        out: list[Slots] = []
        for r in self.state.replicas_of(deployment):
            if r.name in self.leaving:
                continue
            gpu = self.gpu(r.device)
            if r.serving:
                ends = [max(a.predicted_end_s, self.now) for a in r.active]
                ends += self.ends.get(r.name, [])
                if ends:
                    out.append(Slots(gpu, tuple(ends)))
            elif r.phase is ReplicaPhase.LOADING:
                at = max(r.ready_s, self.now)
                n = self.batch_cap(deployment, r.device, items, self.ledger.headroom(r.device, at))
                out.append(Slots(gpu, (at,) * n))
        for p in self.state.planned:
            if p.deployment == deployment:
                spare = self.ledger.headroom(p.device, p.ready_s)
                n = self.batch_cap(deployment, p.device, items, spare)
                out.append(Slots(self.gpu(p.device), (p.ready_s,) * n))
        for dev, ready in self.new_copies.get(deployment, ()):
            spare = self.ledger.headroom(dev, ready)
            n = self.batch_cap(deployment, dev, items, spare)
            out.append(Slots(self.gpu(dev), (ready,) * n))
        return out

    def drain(self, slots: Sequence[Slots], items: Sequence[WorkItem]) -> list[tuple[float, int]]:
        """Predicted (completion, slot group) of `items` in order, each on the group where it
        completes first (list scheduling; each replica runs at the batch its slots hold);
        (INF, -1) where there is no slot at all."""
        heaps = [sorted(g.free_s) for g in slots]
        out: list[tuple[float, int]] = []
        for it in items:
            model = self.model(it.deployment)
            best: tuple[float, int] = (INF, -1)
            for i, g in enumerate(slots):
                if heaps[i]:
                    rt = it.runtime_s(self.costs, model, g.gpu, len(g.free_s))
                    t = heaps[i][0] + rt
                    if t < best[0]:
                        best = (t, i)
            if best[1] >= 0:
                heapq.heapreplace(heaps[best[1]], best[0])
            out.append(best)
        return out

    def could_gain(
        self, deployment: str, items: Sequence[WorkItem], base: Sequence[float], tie_s: float
    ) -> bool:
        """Whether a new copy of `deployment` could complete some item more than `tie_s` before
        `base` (its completion on the supply there is): no copy is ready before a load from now
        on its GPU, nor runs an item faster than alone."""
        model = self.model(deployment)
        gpus = {self.gpu(d.name) for d in self.state.devices if self.state.fit(deployment, d.name)}
        earliest = {g: self.now + self.costs.load_s(model, g) for g in gpus}
        return bool(earliest) and any(
            b - min(t + it.runtime_s(self.costs, model, g) for g, t in earliest.items()) > tie_s
            for it, b in zip(items, base, strict=True)
        )

    def slot_free_s(self, deployment: str) -> float:
        """Earliest predicted free slot on a saturated resident replica of `deployment`."""
        t = INF
        for r in self.state.replicas_of(deployment):
            if r.serving and r.active:
                t = min(t, max(min(a.predicted_end_s for a in r.active), self.now))
        return t

    def has_copy(self, deployment: str) -> bool:
        """A replica of `deployment` exists (not leaving) or is on its way."""
        if self.supply(deployment):
            return True
        return any(
            r.phase is not ReplicaPhase.UNLOADING for r in self.state.replicas_of(deployment)
        )

    def decisions(self) -> Decisions:
        return Decisions(
            submits=tuple(self.submits),
            loads=tuple(self.loads),
            unloads=tuple(self.unloads),
            grants=tuple(self.grants),
        )


@dataclass(frozen=True, slots=True)
class _Candidate:
    """A lifecycle option for ready demand, with the terms it is ranked by."""

    counts: tuple[float, ...]  # minus the work it covers per priority class, most urgent first
    done_s: float
    leftover_bytes: int
    option: LifecycleOption
    items: list[WorkItem]


def _best(cands: list[_Candidate], tie_s: float) -> _Candidate:
    """Most ready work per priority class; then the earliest completion, where completions
    within `tie_s` of the earliest are equal (below the predictions' resolution); then the
    least lifecycle overhead; then best fit (least memory left on the device)."""
    top = min(c.counts for c in cands)
    same = [c for c in cands if c.counts == top]
    first = min(c.done_s for c in same)
    close = [c for c in same if c.done_s <= first + tie_s]
    return min(
        close,
        key=lambda c: (
            c.option.overhead_s,
            c.leftover_bytes,
            c.done_s,
            c.option.deployment,
            c.option.device,
        ),
    )


def aging_key(unit: WorkUnit, release_s: float, now: float, aging_s: float) -> tuple[int, float]:
    """Priority class after aging (one class per `aging_s` waited), then release time."""
    waited = max(now - release_s, 0.0)
    bonus = int(waited // aging_s) if aging_s > 0 else 0
    return (unit.priority - bonus, release_s)


def place_on_standing_grant(rd: Round, item: WorkItem) -> bool:
    """Send a unit that a standing grant binds to its replica; True if the grant exists."""
    name = rd.state.grant_of(item.head.unit_id)
    if name is None:
        return False
    r = rd.state.replica(name)
    if r.serving:
        rd.submit(WorkItem((item.head,), item.release_s), r, grant=False)
    return True


class JointPlan:
    """Prediction-guided joint plan (see the module docstring)."""

    name = "joint"

    def plan(self, snapshot: Snapshot) -> Decisions:
        snap = pool_snapshot(snapshot, self.name)
        rd = Round(snap)
        opts = snap.options
        chains = snap.chains if opts.fusion else None
        items = [work_item(w.unit, w.release_s, snap.units, chains) for w in snap.window.ready]
        items.sort(
            key=lambda it: (
                aging_key(it.head, it.release_s, rd.now, opts.aging_s),
                it.head.unit_id,
            )
        )
        unmet: list[WorkItem] = []
        for it in items:
            if place_on_standing_grant(rd, it):
                continue
            best = self._reuse(rd, it)
            if best is None:
                unmet.append(it)
            else:
                rd.submit(it, best, grant=True)
        self._lifecycle_for_ready(rd, unmet)
        # no ready action can advance: none was taken or held (ready work that no option can
        # serve does not stop a prefetch; a prefetch only takes free memory or safe victims)
        if opts.prefetch and not rd.loads and not rd.deferred:
            self._prefetch(rd)
        return rd.decisions()

    @staticmethod
    def _reuse(rd: Round, item: WorkItem) -> ReplicaInfo | None:
        cands = [r for r in rd.state.replicas_of(item.deployment) if rd.can_accept(r, item)]
        if not cands:
            return None
        return min(cands, key=lambda r: (rd.completion_on(r, item), rd.batch[r.name][0], r.name))

    @staticmethod
    def _lifecycle_for_ready(rd: Round, unmet: list[WorkItem]) -> None:
        """Cover unmet ready demand with lifecycle actions.

        An option (a new copy) is a candidate only if it serves some work sooner than the
        supply there is — every item is list-scheduled on the existing replicas (queues
        drained) with and without it — and that gain (unit-seconds of completion) exceeds the
        delay reclaiming its victims puts on their own work still to start
        (`constructor.victim_delay_s`). Work with no supply at all gains without bound.
        """
        classes = sorted({it.head.priority for it in unmet})
        next_use = rd.snap.window.next_use_s
        pending = rd.snap.window.releases_s
        work = {w.unit.unit_id: w.downstream_work_s for w in rd.snap.window.ready}
        demand = {dm.deployment: list(dm.items) for dm in coalesce(unmet)}
        tie_s = rd.snap.options.tie_s
        while True:
            cands: list[_Candidate] = []
            for d, items in sorted(demand.items()):
                slots = rd.supply_slots(d, items)
                base = [t for t, _ in rd.drain(slots, items)]
                if not rd.could_gain(d, items, base, tie_s):
                    continue  # no new copy could serve any item sooner: skip its options
                for dev in rd.state.device_names():
                    opt = lifecycle_option(
                        rd.state, rd.ledger, d, dev, rd.costs, next_use, exclude=rd.exclude,
                        await_unloads=True,
                    )  # fmt: skip
                    if opt is None:
                        continue
                    cap = rd.batch_cap(d, dev, items, rd.leftover_bytes(opt))
                    new = Slots(rd.gpu(dev), (opt.ready_s,) * cap)
                    placed = rd.drain([*slots, new], items)
                    # an item gains only where it completes sooner by more than the
                    # predictions resolve (`tie_s`)
                    cov = [
                        (it, t, b - t)
                        for it, (t, g), b in zip(items, placed, base, strict=True)
                        if g == len(slots) and b - t > tie_s
                    ]
                    if not cov:
                        continue
                    gain = sum(x for _, _, x in cov)
                    cost = victim_delay_s(rd.state, opt.victims, pending, rd.costs, rd.leaving)
                    if not gain > cost:
                        continue
                    done = max(t for _, t, _ in cov)
                    counts = tuple(
                        -sum(work[it.head.unit_id] for it, _, _ in cov if it.head.priority == c)
                        for c in classes
                    )
                    picked = [it for it, _, _ in cov]
                    cands.append(_Candidate(counts, done, rd.leftover_bytes(opt), opt, picked))
            if not cands:
                break
            pick = _best(cands, tie_s)
            if pick.option.after:
                rd.defer(pick.option)
            else:
                rd.take(pick.option, [it.head.unit_id for it in pick.items])

    @staticmethod
    def _prefetch(rd: Round) -> None:
        """Prefetch deployments of near-ready work whose release nears load time + slack."""
        slack = rd.snap.options.prefetch_slack_s
        next_use = rd.snap.window.next_use_s
        groups: dict[str, list[WindowUnit]] = {}
        for w in rd.snap.window.near_ready:
            groups.setdefault(w.unit.deployment, []).append(w)
        while True:
            best: tuple[tuple[object, ...], LifecycleOption, list[WindowUnit]] | None = None
            for d, ws in sorted(groups.items()):
                if rd.has_copy(d):
                    continue
                release = min(w.release_s for w in ws)
                prio = min(w.unit.priority for w in ws)
                for dev in rd.state.device_names():
                    victims = prefetch_victims(
                        rd.state, dev, next_use, rd.costs, release, rd.exclude
                    )
                    opt = lifecycle_option(
                        rd.state,
                        rd.ledger,
                        d,
                        dev,
                        rd.costs,
                        next_use,
                        prefetch=True,
                        exclude=rd.exclude,
                        protect_before_s=release,
                        victims=victims,
                    )
                    if opt is None or release > opt.ready_s + slack:
                        continue
                    key = (prio, release, opt.ready_s, opt.overhead_s, d, dev)
                    if best is None or key < best[0]:
                        best = (key, opt, ws)
            if best is None:
                return
            _, opt, ws = best
            rd.take(opt, [w.unit.unit_id for w in ws])
            groups.pop(opt.deployment)


register_plan("joint", JointPlan)
