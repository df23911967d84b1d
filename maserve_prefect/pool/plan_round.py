"""One pool plan call's working state: what it has committed so far, and the supply it judges by.

One idea: a plan call is a greedy pass, and `Round` is the scratch state it mutates — a
`MemoryLedger` over the snapshot's pool (every load, reclaim and request is checked with
`MemoryLedger.fits` at every predicted transition), the batch each replica would run, the
replicas this round reclaims or hands work to, and the submits, grants, loads and unloads
committed; `decisions()` freezes them into `Decisions`. A replica takes work only while its
committed KV blocks stay within its admission limit (`pool.admission`: output limit, ε_M,
ρ(t), granted chains' reservations), so work beyond it waits in the planner, where a new copy
can take it, never in an engine queue. It also predicts where queued work of a
deployment runs next (`supply_slots`, `drain`): a serving replica frees a slot as each request of
its batch ends (this round's submits included: its queue drains), and a loading, planned or
just-decided copy opens as many slots as its memory allows when its load ends. The joint plan
(`pool.joint_plan`) and the baselines (`pool.baselines`) both decide through it.

Examples:
    >>> Slots("A100-40GB", (1.0, 2.0)).free_s
    (1.0, 2.0)
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from maserve_prefect.dispatch.snapshot import Decisions, Grant, Load, Submit, Unload
from maserve_prefect.pool.admission import admit_limit_blocks, blocks_for, committed_blocks
from maserve_prefect.pool.constructor import LifecycleOption
from maserve_prefect.pool.fusion import WorkItem
from maserve_prefect.pool.memory_ledger import MemoryLedger
from maserve_prefect.pool.snapshot import PoolSnapshot
from maserve_prefect.pool.state import INF, PoolState, ReplicaInfo
from maserve_prefect.protocol.state import Lifecycle


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
        self.unit_ends: dict[str, float] = {}  # unit -> predicted end, this round's submits
        self.deferred: list[LifecycleOption] = []  # loads waiting for unloads under way
        self.kv_used: dict[str, int] = {}  # replica -> KV blocks its committed work holds
        # deployment -> releases of its unplaced ready and near-ready units (set by the plan)
        self.window_demand: dict[str, list[float]] = {}
        for r in self.state.replicas:
            n = len(r.active)
            self.batch[r.name] = (
                n,
                max((a.input_len for a in r.active), default=0),
                max((a.max_tokens for a in r.active), default=0),
            )
            chains = [left for rep, left in self.state.grants if rep == r.name]
            active = [(a.unit_id, a.context_tokens) for a in r.active]
            self.kv_used[r.name] = committed_blocks(active, chains, snap.units, r.block_size)

    def model(self, deployment: str) -> str:
        return self.state.deployment(deployment).model

    def gpu(self, device: str) -> str:
        return self.state.device(device).gpu

    # -- requests --------------------------------------------------------------------------

    def item_blocks(self, item: WorkItem, block_size: int) -> int:
        """KV blocks `item` reserves on admission: its chain's largest context on the output
        limit (`pool.admission`)."""
        return blocks_for(item.envelope.max_context_tokens, block_size)

    def kv_limit(self, deployment: str, kv_blocks: int) -> int:
        """Blocks committed work may hold on a replica of `deployment` with `kv_blocks`."""
        return admit_limit_blocks(kv_blocks, self.snap.kv_backoff_blocks.get(deployment, 0))

    def kv_fits(self, r: ReplicaInfo, item: WorkItem) -> bool:
        """`item` fits `r`'s KV admission limit beside its committed work (an idle replica
        takes one item that fits its whole pool)."""
        need = self.item_blocks(item, r.block_size)
        used = self.kv_used[r.name]
        if used == 0:
            return need <= r.kv_blocks
        return used + need <= self.kv_limit(r.deployment, r.kv_blocks)

    def can_accept(self, r: ReplicaInfo, item: WorkItem) -> bool:
        """Resident, accepting, below its batch limit, and KV admission fits.

        A request takes no device memory beyond its replica's footprint: the replica
        pre-allocated its KV cache at load (vLLM's `gpu_memory_utilization`, or a fixed
        `kv_cache_bytes`), so what a request needs is KV blocks, which `kv_fits` checks against
        the engine's own count. Charging the predicted peak memory of the batch as extra device
        bytes counted that KV twice, on a predicted size: on the full pool it held back
        calls a replica had room for (1,910 s of waits beside a serving replica with accurate
        costs vs 843 s without the charge; burst makespan 123.6 -> 113.1 s)."""
        if not r.serving or item.deployment != r.deployment or r.name in self.leaving:
            return False
        if self.batch[r.name][0] >= r.max_num_seqs:
            return False
        return self.kv_fits(r, item)

    def completion_on(self, r: ReplicaInfo, item: WorkItem) -> float:
        n = self.batch[r.name][0] + 1
        return self.now + item.runtime_s(
            self.costs, self.model(r.deployment), self.gpu(r.device), n
        )

    def submit(self, item: WorkItem, r: ReplicaInfo, grant: bool, reserve: bool = True) -> None:
        """Send `item`'s head to `r` now (and grant it the chain); `reserve=False` for a
        member of a standing grant, whose KV its grant already holds."""
        end = self.completion_on(r, item)
        n, mi, mo = self.batch[r.name]
        env = item.envelope
        self.batch[r.name] = (n + 1, max(mi, env.max_input_len), max(mo, env.max_output_len))
        self.ends.setdefault(r.name, []).append(end)
        self.unit_ends[item.head.unit_id] = end
        if reserve:
            self.kv_used[r.name] += self.item_blocks(item, r.block_size)
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
            if r.lifecycle.becoming_ready:
                out.append((max(r.ready_s, self.now), r.max_num_seqs))
        for p in self.state.planned:
            if p.deployment == deployment:
                fit = self.state.fit(deployment, p.device)
                out.append((p.ready_s, fit.max_num_seqs if fit else 1))
        return sorted(out)

    def batch_cap(self, deployment: str, device: str, items: Sequence[WorkItem]) -> int:
        """How many of `items` a fresh replica of `deployment` on `device` can run at once:
        its batch limit and the items (in order) its KV admission limit holds (at least one:
        admission counts it then). Its KV cache is pre-allocated (`can_accept`)."""
        fit = self.state.fit(deployment, device)
        if fit is None or not items:
            return 0
        limit = self.kv_limit(deployment, fit.kv_capacity_tokens // max(fit.block_size, 1))
        num_kv, used = 0, 0
        for it in items:
            used += self.item_blocks(it, fit.block_size)
            if used > limit:
                break
            num_kv += 1
        return min(fit.max_num_seqs, len(items), max(num_kv, 1))

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
            elif r.lifecycle.becoming_ready:
                at = max(r.ready_s, self.now)
                n = self.batch_cap(deployment, r.device, items)
                out.append(Slots(gpu, (at,) * n))
        for p in self.state.planned:
            if p.deployment == deployment:
                n = self.batch_cap(deployment, p.device, items)
                out.append(Slots(self.gpu(p.device), (p.ready_s,) * n))
        for dev, ready in self.new_copies.get(deployment, ()):
            n = self.batch_cap(deployment, dev, items)
            out.append(Slots(self.gpu(dev), (ready,) * n))
        return out

    def drain(self, slots: Sequence[Slots], items: Sequence[WorkItem]) -> list[tuple[float, int]]:
        """Predicted (completion, slot group) of `items` in order, each on the group where it
        completes first (list scheduling; each replica runs at the batch its slots hold; an
        item starts no earlier than its release); (INF, -1) where there is no slot at all."""
        heaps = [sorted(g.free_s) for g in slots]
        out: list[tuple[float, int]] = []
        for it in items:
            model = self.model(it.deployment)
            best: tuple[float, int] = (INF, -1)
            for i, g in enumerate(slots):
                if heaps[i]:
                    rt = it.runtime_s(self.costs, model, g.gpu, len(g.free_s))
                    t = max(heaps[i][0], it.release_s) + rt
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
            r.lifecycle is not Lifecycle.UNLOADING for r in self.state.replicas_of(deployment)
        )

    def decisions(self) -> Decisions:
        return Decisions(
            submits=tuple(self.submits),
            loads=tuple(self.loads),
            unloads=tuple(self.unloads),
            grants=tuple(self.grants),
        )
