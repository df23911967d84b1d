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
from maserve_prefect.pool.snapshot import pool_snapshot
from maserve_prefect.pool.state import ReplicaInfo
from maserve_prefect.pool.window import WindowUnit, WorkUnit


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
