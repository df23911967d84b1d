"""The joint pool plan: lifecycle, replica, device and order chosen together, one prefix at a time.

One idea: each call is a pure, greedy pass over an extended snapshot (`PoolSnapshot`: pool state +
window + predictions) that commits only what can start now, and every event replans
(Algorithm 1 of the paper, §3.5):

1. Ready work items (a unit and the rest of its fused chain) are ranked by priority with aging
   (a unit gains one priority class per `aging_s` waited), then ready time, then id. Work is
   timed on the p90 output of its node's recent completions and admitted on its output limit
   (`pool.outputs`, `pool.admission`).
2. Each item first *reuses* an accepting resident replica of its deployment (earliest predicted
   completion; batch limit, KV admission — committed blocks on the output limit, ε_M, ρ(t),
   granted chains' reservations — checked; a request takes no device bytes beyond the
   replica's footprint, whose KV cache is pre-allocated, `Round.can_accept`) and gets a
   `Grant` for its chain. A unit that a standing grant binds goes to that replica only. Work no replica admits
   stays here, unbound: the next prefix is all that is committed.
3. The rest is coalesced per deployment and gets lifecycle options on every device, scale-out
   included: Load into free memory, Load once unloads already under way end, or Reclaim+Load
   (victims lease-free and idle: redundant copies first, then most distant next use beyond
   their reload, `constructor.victim_order`). An option is a candidate only if it has a
   predicted *benefit*: every unmet item is list-scheduled on the supply there is — a serving
   replica frees a slot as each request of its batch ends (its queue drains, this round's
   submits included), a loading, planned or just-decided copy opens as many slots as its
   memory and KV admission allow when its load ends — with and without the new copy, and the
   completion time it saves (unit-seconds) must exceed the delay it puts on other work:
   reclaiming its victims (`constructor.victim_delay_s`) and holding the only devices
   constrained demand of the window fits (`scarce.scarce_delay_s`); work with no supply at all
   gains without bound. Candidates are ranked by Eq. 12's key, with the scarce-device term
   deciding *placement* first: a deployment's first copy is considered only on the devices where
   it delays constrained demand least, a scale-out copy only where no option of any deployment
   delays it less (so flexible work never takes a scarce device for a second copy while
   constrained demand waits for it; within `tie_s` counts as equal). Then the ready units covered per
   priority class (most urgent class first, `A_1..A_K`), then predicted completion of the
   covered work (`C_F`; within `tie_s` of the earliest counts as equal: below what the
   predictions resolve), then lifecycle overhead (`H_life`), then best fit (least memory left
   on the device, so that large holes stay for large models). The best is committed to the
   memory ledger and the search repeats. An option that waits for unloads under way decides
   nothing yet: its memory is held for the round, and the unloads' end is an event that
   replans.
   With `PlanOptions.provision` (off by default), copies are then added into free memory by
   predicted work per deployment over ready, near-ready and known future units
   (`pool.provision`), and the A100-only demand of Qwen3-14B reserves its devices: a first
   copy of a flexible deployment goes where constrained work loses least, a scale-out copy not
   where constrained work gains more. On the full pool, burst, it filled all twelve GPUs at
   t = 0 but ran the long Qwen3-8B QMSum chains on V100 copies 2-3x slower: makespan 149.4 s
   vs 138.8 s without it (p95 113.8 vs 117.0 s; 5 runs), so it is not the default.
4. Only when no ready action can advance — no lifecycle action for ready work was taken or
   held this round — near-ready work is provisioned: the window's near-ready units and those
   this round's submits make near-ready (`window.near_ready_after`), coalesced per deployment.
   A deployment with no copy is prefetched once its earliest predicted release is within load
   time + `prefetch_slack_s`; one with copies gets another (scale-out) only if, list-scheduled
   at their releases, some of its near-ready items complete more than `tie_s` sooner on it.
   A second copy is prefetched only into free memory (a speculative scale-out that evicted
   redundant copies swapped them back and forth under Poisson arrivals: 40 loads and 28
   unloads where 12 loads serve). A prefetch never delays constrained demand (scarce delay
   must be nil), evicts only
   redundant copies and replicas predicted to be needed after the prefetched work plus their
   reload (`constructor.prefetch_victims`), and never memory a held load counts on. Ranked by
   priority, then release (timely first), then overhead.

Every load, reclaim and request goes through `MemoryLedger.fits` at every predicted transition,
victims are lease-free and idle, and committed work (requests in flight, granted chains) is never
moved or reclaimed — so replanning after an early or late completion keeps it. A call's working
state and supply model are a `plan_round.Round`; its input is a `pool.snapshot.PoolSnapshot`.

Examples:
    >>> from maserve_prefect.dispatch.plans import get_plan
    >>> get_plan("joint").name
    'joint'
"""

from __future__ import annotations

from dataclasses import dataclass

from maserve_prefect.dispatch.snapshot import Decisions, Snapshot
from maserve_prefect.pool.constructor import (
    LifecycleOption,
    lifecycle_option,
    prefetch_victims,
    victim_delay_s,
)
from maserve_prefect.pool.fusion import WorkItem, coalesce, work_item
from maserve_prefect.pool.plan_round import Round, Slots
from maserve_prefect.pool.provision import (
    Work,
    constrained_gain_s,
    copy_gain_s,
    known_work,
    provision_by_work,
)
from maserve_prefect.pool.scarce import scarce_delay_s
from maserve_prefect.pool.snapshot import pool_snapshot
from maserve_prefect.pool.state import ReplicaInfo
from maserve_prefect.pool.window import WorkUnit, near_ready_after


@dataclass(frozen=True, slots=True)
class _Candidate:
    """A lifecycle option for ready demand, with the terms it is ranked by."""

    scarce_s: float  # delay it puts on constrained pending demand (`scarce.scarce_delay_s`)
    counts: tuple[int, ...]  # minus the ready units it covers per priority class, urgent first
    done_s: float
    leftover_bytes: int
    option: LifecycleOption
    items: list[WorkItem]
    scale_out: bool  # its deployment already has a copy
    reserve_s: float = 0.0  # what its device is worth to constrained work (`provision`)


def _best(cands: list[_Candidate], tie_s: float) -> _Candidate:
    """Placement by scarce-device delay (a first copy: its deployment's least; a scale-out
    copy: the least of all; within `tie_s` equal); then most ready units per priority class; then the earliest completion, where completions within `tie_s` of the earliest are
    equal (below the predictions' resolution); then the least lifecycle overhead; then best
    fit (least memory left on the device)."""
    least: dict[str, float] = {}
    for c in cands:
        d = c.option.deployment
        least[d] = min(least.get(d, c.scarce_s), c.scarce_s)
    overall = min(least.values())
    cands = [
        c
        for c in cands
        if c.scarce_s <= (overall if c.scale_out else least[c.option.deployment]) + tie_s
    ]
    # a first copy goes where constrained work loses least (`provision.constrained_gain_s`)
    keep: dict[str, float] = {}
    for c in cands:
        if not c.scale_out:
            d = c.option.deployment
            keep[d] = min(keep.get(d, c.reserve_s), c.reserve_s)
    cands = [c for c in cands if c.scale_out or c.reserve_s <= keep[c.option.deployment] + tie_s]
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
        rd.submit(WorkItem((item.head,), item.release_s), r, grant=False, reserve=False)
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
        near = [(w.unit, w.release_s) for w in snap.window.near_ready]
        near += near_ready_after(snap.window, snap.units, rd.unit_ends)
        demand: dict[str, list[float]] = {}
        for w in snap.window.ready:
            if w.unit.unit_id not in rd.unit_ends:
                demand.setdefault(w.unit.deployment, []).append(rd.now)
        for u, t in near:
            demand.setdefault(u.deployment, []).append(t)
        rd.window_demand = demand
        work = known_work(rd) if opts.provision else {}
        self._lifecycle_for_ready(rd, unmet, work)
        if opts.provision:
            serves: dict[str, list[str]] = {}
            for it in unmet:
                if it.head.unit_id not in rd.unit_ends:
                    serves.setdefault(it.deployment, []).append(it.head.unit_id)
            for u, _ in near:
                serves.setdefault(u.deployment, []).append(u.unit_id)
            provision_by_work(rd, work, serves)
        # no ready action can advance: none was taken or held (ready work that no option can
        # serve does not stop a prefetch; a prefetch only takes free memory or safe victims)
        if opts.prefetch and not rd.loads and not rd.deferred:
            self._prefetch(rd, [work_item(u, t, snap.units, chains) for u, t in near])
        return rd.decisions()

    @staticmethod
    def _reuse(rd: Round, item: WorkItem) -> ReplicaInfo | None:
        cands = [r for r in rd.state.replicas_of(item.deployment) if rd.can_accept(r, item)]
        if not cands:
            return None
        return min(cands, key=lambda r: (rd.completion_on(r, item), rd.batch[r.name][0], r.name))

    @staticmethod
    def _lifecycle_for_ready(rd: Round, unmet: list[WorkItem], work: dict[str, Work]) -> None:
        """Cover unmet ready demand with lifecycle actions.

        An option (a new copy) is a candidate only if it serves some work sooner than the
        supply there is — every item is list-scheduled on the existing replicas (queues
        drained) with and without it — and that gain (unit-seconds of completion) exceeds the
        delay reclaiming its victims puts on their own work still to start
        (`constructor.victim_delay_s`) and holding a device constrained demand needs
        (`scarce.scarce_delay_s`). Work with no supply at all gains without bound. A scale-out
        copy (its deployment has one) is not placed where constrained work with a copy of its
        own would gain more from a copy than this deployment's known work does
        (`provision.constrained_gain_s` vs `provision.copy_gain_s`; with `work`, the known
        work per deployment, empty when provisioning is off).
        """
        classes = sorted({it.head.priority for it in unmet})
        next_use = rd.snap.window.next_use_s
        pending = rd.snap.window.releases_s
        demand = _demand(unmet, rd.snap.options.coalesce)
        tie_s = rd.snap.options.tie_s
        while True:
            cands: list[_Candidate] = []
            for (d, _), items in sorted(demand.items()):
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
                    copy = rd.has_copy(d)
                    if d in work and copy and _constrained_first(rd, work, d, opt):
                        continue
                    cap = rd.batch_cap(d, dev, items)
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
                    done = max(t for _, t, _ in cov)
                    cost = victim_delay_s(rd.state, opt.victims, pending, rd.costs, rd.leaving)
                    scarce = _scarce(rd, opt, done)
                    if not gain > cost + scarce:
                        continue
                    counts = tuple(
                        -sum(1 for it, _, _ in cov if it.head.priority == c) for c in classes
                    )
                    picked = [it for it, _, _ in cov]
                    left = rd.leftover_bytes(opt)
                    reserve = 0.0
                    if d in work and not copy:
                        reserve = constrained_gain_s(rd, work, d, dev)
                    cands.append(_Candidate(scarce, counts, done, left, opt, picked, copy, reserve))
            if not cands:
                break
            pick = _best(cands, tie_s)
            if pick.option.after:
                rd.defer(pick.option)
            else:
                rd.take(pick.option, [it.head.unit_id for it in pick.items])

    @staticmethod
    def _prefetch(rd: Round, near: list[WorkItem]) -> None:
        """Provision near-ready work: prefetch a deployment with no copy once its release nears
        load time + slack, add a copy where near-ready work completes sooner on it; never
        delaying constrained demand (module docstring, step 4)."""
        slack = rd.snap.options.prefetch_slack_s
        tie_s = rd.snap.options.tie_s
        next_use = rd.snap.window.next_use_s
        groups = _demand(near, rd.snap.options.coalesce)
        while True:
            best: tuple[tuple[object, ...], LifecycleOption, list[WorkItem]] | None = None
            for (d, group), items in sorted(groups.items()):
                release = min(it.release_s for it in items)
                prio = min(it.head.priority for it in items)
                copy = rd.has_copy(d)
                slots = rd.supply_slots(d, items) if copy else []
                base = [t for t, _ in rd.drain(slots, items)]
                if copy and not rd.could_gain(d, items, base, tie_s):
                    continue
                for dev in rd.state.device_names():
                    victims = prefetch_victims(
                        rd.state, dev, next_use, rd.costs, release, rd.exclude
                    )
                    opt = lifecycle_option(
                        rd.state, rd.ledger, d, dev, rd.costs, next_use, prefetch=True,
                        exclude=rd.exclude, protect_before_s=release, victims=victims,
                        allow_reclaim=not copy,
                    )  # fmt: skip
                    if opt is None or release > opt.ready_s + slack:
                        continue
                    cap = rd.batch_cap(d, dev, items)
                    placed = rd.drain([*slots, Slots(rd.gpu(dev), (opt.ready_s,) * cap)], items)
                    gains = [
                        b - t
                        for (t, g), b in zip(placed, base, strict=True)
                        if g == len(slots) and b - t > tie_s
                    ]
                    if not gains:
                        continue
                    done = max(t for t, g in placed if g == len(slots))
                    if _scarce(rd, opt, done) > 0.0:
                        continue
                    key = (prio, release, opt.ready_s, opt.overhead_s, d, group, dev)
                    if best is None or key < best[0]:
                        best = (key, opt, items)
            if best is None:
                return
            chosen, opt, items = best
            rd.take(opt, [u for it in items for u in it.unit_ids[:1]])
            groups.pop((opt.deployment, str(chosen[5])))


def _demand(items: list[WorkItem], pooled: bool) -> dict[tuple[str, str], list[WorkItem]]:
    """Work items by (deployment, group): one group per deployment when demand is pooled across
    workflows, else one per root (the per-workflow ablation, `PlanOptions.coalesce`)."""
    out: dict[tuple[str, str], list[WorkItem]] = {}
    for dm in coalesce(items):
        for it in dm.items:
            out.setdefault((dm.deployment, "" if pooled else it.head.root_id), []).append(it)
    return out


def _constrained_first(
    rd: Round, work: dict[str, Work], deployment: str, opt: LifecycleOption
) -> bool:
    """Constrained work would gain more from a copy on `opt`'s device than `deployment`'s known
    work gains from this scale-out copy (`provision`)."""
    other = constrained_gain_s(rd, work, deployment, opt.device)
    return other > 0.0 and other > copy_gain_s(rd, work[deployment], opt.device, opt.ready_s)


def _scarce(rd: Round, opt: LifecycleOption, busy_until_s: float) -> float:
    """The scarce-device delay of `opt` holding its device until `busy_until_s`."""
    return scarce_delay_s(
        rd.state,
        opt.deployment,
        opt.device,
        busy_until_s,
        rd.window_demand,
        rd.costs,
        gone=rd.leaving | {v.name for v in opt.victims},
        decided=rd.new_copies,
        taken_devices={dev for copies in rd.new_copies.values() for dev, _ in copies},
    )
