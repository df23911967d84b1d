"""The joint pool plan: lifecycle, replica, device and order chosen together, one prefix at a time.

One idea: each call is a pure, greedy pass over an extended snapshot (`PoolSnapshot`: pool state +
window + predictions) that commits only what can start now, and every event replans:

1. Ready work items (a unit and the rest of its fused chain) are ranked by priority with aging
   (a unit gains one priority class per `aging_s` waited), then ready time, then id.
2. Each item first *reuses* an accepting resident replica of its deployment (earliest predicted
   completion; batch limit, KV envelope and request memory checked) and gets a `Grant` for its
   chain. A unit that a standing grant binds goes to that replica only.
3. The rest is coalesced per deployment. Replicas already loading (or waiting for victims) cover
   demand up to their batch limit; uncovered demand gets lifecycle options — Load or
   Reclaim+Load on every device, scale-out included — ranked by the key: ready-work coverage per
   priority class (most urgent class first), then predicted completion (completions within
   `tie_s` of the earliest count as equal: that is below what the predictions resolve), then
   lifecycle overhead, then best fit (least memory left on the device, so that large holes stay
   for large models).
   An option is taken only if it serves sooner than waiting for existing supply (a loading
   replica, or a free slot on a saturated one). The best option is committed to the memory
   ledger and the search repeats.
4. Only when no lifecycle action for ready work was taken and no ready unit is left blocked, a
   deployment of near-ready work with no replica is *prefetched* if its predicted release is
   within load time + `prefetch_slack_s` (ranked by priority, then release — timely first — then
   overhead). A prefetch evicts only redundant copies and replicas predicted to be needed after
   the prefetched work plus their reload (`constructor.prefetch_victims`).

Every load, reclaim and request goes through `MemoryLedger.fits` at every predicted transition,
victims are lease-free and idle, and committed work (requests in flight, granted chains) is never
moved or reclaimed — so replanning after an early or late completion keeps it.

Examples:
    >>> from maserve_prefect.runtime.plans import get_plan
    >>> get_plan("joint").name
    'joint'
"""

from __future__ import annotations

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
        n, mi, mo = self.batch[r.name]
        env = item.envelope
        self.batch[r.name] = (n + 1, max(mi, env.max_input_len), max(mo, env.max_output_len))
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

    def slot_free_s(self, deployment: str) -> float:
        """Earliest predicted free slot on a saturated resident replica of `deployment`."""
        t = INF
        for r in self.state.replicas_of(deployment):
            if r.serving and r.active:
                t = min(t, max(min(a.predicted_end_s for a in r.active), self.now))
        return t

    def servable(self, deployment: str) -> bool:
        """Whether some device of the pool can hold the deployment at all."""
        return any(self.state.fit(deployment, d.name) for d in self.state.devices)

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

    counts: tuple[int, ...]  # minus the units it covers per priority class, most urgent first
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
        blocked = self._lifecycle_for_ready(rd, unmet)
        if opts.prefetch and not rd.loads and not blocked:
            self._prefetch(rd)
        return rd.decisions()

    @staticmethod
    def _reuse(rd: Round, item: WorkItem) -> ReplicaInfo | None:
        cands = [r for r in rd.state.replicas_of(item.deployment) if rd.can_accept(r, item)]
        if not cands:
            return None
        return min(cands, key=lambda r: (rd.completion_on(r, item), rd.batch[r.name][0], r.name))

    @staticmethod
    def _lifecycle_for_ready(rd: Round, unmet: list[WorkItem]) -> bool:
        """Cover unmet ready demand with lifecycle actions; True if some stays blocked."""
        classes = sorted({it.head.priority for it in unmet})
        next_use = rd.snap.window.next_use_s
        pending: dict[str, list[WorkItem]] = {}
        wait: dict[str, float] = {}
        for demand in coalesce(unmet):
            d = demand.deployment
            supply = rd.supply(d)
            covered = sum(cap for _, cap in supply)
            pending[d] = list(demand.items[covered:])
            wait[d] = min([t for t, _ in supply] + [rd.slot_free_s(d)])
        while True:
            cands: list[_Candidate] = []
            for d, left in sorted(pending.items()):
                if not left:
                    continue
                model = rd.model(d)
                for dev in rd.state.device_names():
                    opt = lifecycle_option(
                        rd.state, rd.ledger, d, dev, rd.costs, next_use, exclude=rd.exclude
                    )
                    if opt is None or opt.ready_s >= wait[d]:
                        continue
                    fit = rd.state.fit(d, dev)
                    cov = left[: fit.max_num_seqs if fit else 1]
                    gpu = rd.gpu(dev)
                    done = opt.ready_s + max(it.runtime_s(rd.costs, model, gpu) for it in cov)
                    counts = tuple(-sum(it.head.priority == c for it in cov) for c in classes)
                    cands.append(_Candidate(counts, done, rd.leftover_bytes(opt), opt, cov))
            if not cands:
                break
            pick = _best(cands, rd.snap.options.tie_s)
            opt, cov = pick.option, pick.items
            rd.take(opt, [it.head.unit_id for it in cov])
            d = opt.deployment
            pending[d] = pending[d][len(cov) :]
            wait[d] = min(wait[d], opt.ready_s)
        return any(left and wait[d] == INF and rd.servable(d) for d, left in pending.items())

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
