"""The simulator's engine side of HEAR: force resolution, cache controls, state reports.

One idea: a `SimReplica` answers every control the way `protocol.fake.ReferenceEngine` does —
`protocol.force.resolve` against its `HearCapabilities`, then only `Resolution.honoured` is applied
— and the cache controls act on the real simulated KV state: `CacheRetain` pins block hashes
(`retention.py`), `CacheRelease` unpins them, `CachePrepare` loads host-tier blocks onto the GPU
(`host_tier.py`) in a transfer that occupies the replica between steps.

Judging a control — `resolve` plus the checks of what the KV state allows, and a submission's
`SubmitPlan` — is `hear.resolve.HearResolver`, the base of `SimHear`; here is what applies the
honoured ones, keeps the tiers and pins in step with the KV cache (its hooks), and reports state.
Honoured preferences that apply to part of their blocks are recorded in `effects` (one
`CacheEffect` per applied cache control).

A harness names KV blocks by hash (`prompt_block_hashes`) and can mirror residency from a
`ResidencyFeed` (the simulator's KV events, fed by the hooks here). Intents go to an `IntentLog`
that nothing here (or in scheduling) reads.

Examples:
    >>> from maserve_prefect.clock.kernel import Kernel
    >>> from maserve_prefect.engines.sim.replica import SimReplica
    >>> from maserve_prefect.engines.sim.cost.step_time import make_step_model
    >>> rep = SimReplica(Kernel(), make_step_model("Qwen3-0.6B", "H100"), num_gpu_blocks=64)
    >>> caps = rep.hear_capabilities()
    >>> sorted(op.value for op in caps.cache_controls), [t.name for t in caps.kv_tiers]
    (['prepare', 'release', 'retain'], ['GPU'])
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from maserve_prefect.engines.sim.hear.resolve import HearHost, HearResolver
from maserve_prefect.engines.sim.kv.host_tier import HostTier, HostTierConfig
from maserve_prefect.engines.sim.kv.retention import RetentionTable
from maserve_prefect.engines.sim.request import SimRequest
from maserve_prefect.errors import SimulationError
from maserve_prefect.protocol.capabilities import HearCapabilities
from maserve_prefect.protocol.channel import IntentLog
from maserve_prefect.protocol.controls import (
    CacheOp,
    CachePrepare,
    CacheRelease,
    CacheRetain,
    Control,
    Force,
    Tier,
)
from maserve_prefect.protocol.intents import ContinuationIntent, IntentMessage, Prediction
from maserve_prefect.protocol.outcomes import Acceptance, Ticket
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.state import (
    CostEstimate,
    PrefixRange,
    Pressure,
    QueueState,
    StateReport,
    TierCapacity,
)
from maserve_prefect.protocol.subjects import InstanceRef

CONTINUATION_DECAY_S = 400.0
"""Time constant of the recency in the Session-Aware eviction ranking r = p · e^(−idle / 400 s)
(the HEAR paper's Appendix A.2)."""


@dataclass(frozen=True, slots=True)
class CacheEffect:
    """What one applied cache control did (blocks acted on, blocks it named but could not)."""

    at_s: float
    control: Control
    num_applied: int
    num_missing: int
    note: str = ""


@dataclass(frozen=True, slots=True)
class Transfer:
    """A host-to-GPU KV load: at an admission (in that step) or for a `CachePrepare`."""

    start_s: float
    seconds: float
    num_blocks: int
    kind: str  # "admission" | "prepare"
    request_ids: tuple[str, ...] = ()
    num_not_loaded: int = 0  # prepare: blocks that found no allocatable GPU block


def prompt_block_hashes(request: Request, block_size: int) -> tuple[int, ...]:
    """The engine block hashes of `request`'s shareable prompt blocks (what cache controls
    name), as a replica with `block_size`-token blocks computes them.

    Examples:
        >>> r = Request("r", "", num_prompt_tokens=64, prefix_block_hashes=(1, 2),
        ...             prefix_block_size=32)
        >>> len(prompt_block_hashes(r, 16))
        4
    """
    probe = SimRequest(
        request, -1, 0.0, 0, block_size, Ticket(request.request_id, Acceptance.ACCEPTED)
    )
    n = probe.num_shareable_blocks
    return tuple(probe.block_hashes(n)[:n]) if n else ()


Change = tuple[Tier, bool | None, list[int]]


class ResidencyFeed:
    """The changes to one replica's KV-tier residency since the last `drain`: the simulator's
    KV events, as vLLM publishes `BlockStored` / `BlockRemoved` / `AllBlocksCleared` per medium
    (`engines.openai.kv_decode`). Each change is `(tier, stored, hashes)`: `stored` True for
    hashes that became resident in `tier`, False for hashes that left it, None for the tier
    emptied (`hashes` then empty). A feed starts with the residency at subscription as stored
    changes, so a subscriber that applies every change in order holds exactly what a full
    `state_report` lists, at a cost proportional to what changed rather than to what is
    resident. Get one with `SimReplica.subscribe_residency()`.
    """

    __slots__ = ("_changes",)

    def __init__(self) -> None:
        self._changes: list[Change] = []

    def put(self, tier: Tier, stored: bool | None, hashes: list[int]) -> None:
        self._changes.append((tier, stored, hashes))

    def drain(self) -> list[Change]:
        """The changes since the last drain, oldest first (and forget them)."""
        out, self._changes = self._changes, []
        return out


class SimHear(HearResolver):
    """HEAR state of one `SimReplica` (built by it; see the module docstring).

    Args:
        replica: the replica it serves.
        host: the host tier's config, or None (GPU tier only).
    """

    def __init__(self, replica: HearHost, host: HostTierConfig | None) -> None:
        self.rep = replica
        self.kv = replica.kv
        self.intents = IntentLog()
        self.retention = RetentionTable()
        self.host = HostTier(host) if host is not None else None
        self.effects: list[CacheEffect] = []
        self.transfers: list[Transfer] = []
        self.cpu_cached_tokens: dict[str, int] = {}  # finished request -> host-tier hit tokens
        self.num_evictions = 0  # cached GPU blocks evicted since this object exists
        self.capabilities = self._capabilities()
        self._feeds: list[ResidencyFeed] = []
        kv = self.kv
        kv.on_evict = self._on_evict
        if self.host is not None:
            kv.host = self.host
            kv.on_cache = self._on_cache

    def inform(self, intent: IntentMessage) -> None:
        """Record a HEAR intent. A `ContinuationIntent` also enters the eviction ranking: the
        context's resident blocks rank by r = p · e^(−idle / `CONTINUATION_DECAY_S`) — the
        forecast with the recency of the completion it was told at — through the one eviction
        rule (`kv.retention`: soft pins, lowest rank evicted first). The ranking is kept as the
        time-invariant key ln p + t_told / decay, which orders contexts as r does at any later
        instant. It never holds a block a request needs: it only chooses among evictable ones.
        """
        self.intents.inform(intent)
        if isinstance(intent, ContinuationIntent) and intent.block_hashes:
            now = self.rep.clock.now()
            p = max(intent.p_return.value, 1e-12)  # p = 0: evicted first, still ordered
            key = math.log(p) + now / CONTINUATION_DECAY_S
            self.rep.kv_effect(lambda: self._rank(intent.subject.key(), intent.block_hashes, key))

    def _rank(self, context_key: str, hashes: Sequence[int], key: float) -> None:
        resident = [h for h in dict.fromkeys(hashes) if self._where(h) is not None]
        self.retention.pin(context_key, resident, key, Force.PREFERENCE, Tier.GPU)
        self._refresh(resident)

    def subscribe_residency(self) -> ResidencyFeed:
        """A new `ResidencyFeed` of this replica, starting with what is resident now."""
        feed = ResidencyFeed()
        feed.put(Tier.GPU, True, list(self.kv.block_hash.values()))
        if self.host is not None:
            feed.put(Tier.CPU, True, self.host.hashes())
        if not self._feeds:  # the hooks report GPU caching and host changes from now on
            self.kv.on_cache = self._on_cache
            if self.host is not None:
                self.host.on_change = self._on_host_change
        self._feeds.append(feed)
        return feed

    def _capabilities(self) -> HearCapabilities:
        seam = self.rep.capabilities()
        caching = seam.prefix_caching
        tiers = (Tier.GPU, Tier.CPU) if self.host is not None else (Tier.GPU,)
        return HearCapabilities.from_engine(
            seam,
            cache_controls=tuple(CacheOp) if caching else (),
            kv_tiers=tiers if caching else (),
            waiting_requirements=True,
        )

    # -- applying cache controls -----------------------------------------------------------

    def apply_cache(self, controls: Sequence[Control]) -> list[tuple[int, ...]]:
        """Apply honoured cache controls now; returns the GPU loads to run (`CachePrepare`)."""
        loads: list[tuple[int, ...]] = []
        now = self.rep.clock.now()
        for c in controls:
            if isinstance(c, CacheRelease):
                changed = self.retention.release(c.subject.key(), c.block_hashes)
                self._refresh(changed)
                self.effects.append(CacheEffect(now, c, len(changed), 0))
            elif isinstance(c, CacheRetain):
                self._retain(c, now)
            elif isinstance(c, CachePrepare) and c.tier is Tier.GPU:
                todo = tuple(h for h in dict.fromkeys(c.block_hashes) if self._where(h) is Tier.CPU)
                if todo:
                    loads.append(todo)
                self.effects.append(CacheEffect(now, c, len(todo), 0, "load queued"))
        return loads

    def _retain(self, c: CacheRetain, now: float) -> None:
        resident = [h for h in dict.fromkeys(c.block_hashes) if self._where(h) is not None]
        key = c.subject.key()
        gen = self.retention.pin(key, resident, c.retention_priority, c.force, c.tier)
        self._refresh(resident)
        missing = len(set(c.block_hashes)) - len(resident)
        self.effects.append(CacheEffect(now, c, len(resident), missing))
        if c.ttl_s is not None and resident:
            hashes = tuple(resident)

            def expire() -> None:
                self.rep.kv_effect(lambda: self._refresh(self.retention.expire(key, hashes, gen)))

            self.rep.clock.call_at(now + c.ttl_s, expire, name=f"{self.rep.name} ttl {key}")

    def _refresh(self, hashes: Sequence[int]) -> None:
        """Bring GPU block pins and the host tier's protection in line with the table."""
        kv, table = self.kv, self.retention
        for h in hashes:
            b = kv.block_of(h)
            if b >= 0:
                level, prio = table.gpu_level(h)
                kv.set_pin(b, level, prio)
        if self.host is not None:
            self.host.set_protection(table.host_level if len(table) else None)
            self.host.repin(hashes)

    def load_prepared(self, batches: Sequence[tuple[int, ...]]) -> float:
        """Run queued `CachePrepare` loads now: host-tier blocks onto free GPU blocks, as many
        as fit. Returns the transfer's seconds (0 when nothing moved)."""
        host = self.host
        if host is None:
            return 0.0
        todo = [h for h in dict.fromkeys(h for b in batches for h in b) if h in host]
        n = min(len(todo), self.kv.num_free_blocks)  # the rest finds no allocatable block
        if not n:
            return 0.0
        host.take(todo[:n])  # out of the LRU before the GPU's evictions land there
        blocks = self.kv.load_blocks(todo[:n])
        assert len(blocks) == n
        seconds = host.config.transfer_s(n)
        now = self.rep.clock.now()
        self.transfers.append(Transfer(now, seconds, n, "prepare", (), len(todo) - n))
        return seconds

    # -- admissions that hit the host tier -------------------------------------------------

    def admission_loads(self) -> float:
        """The host-tier loads of this step's admissions (noted on each request): seconds
        added to the step."""
        loads = list(self.kv.host_loads)
        self.kv.host_loads.clear()  # in place: the replica tests this list every step
        host = self.host
        assert host is not None
        total = sum(n for _, n in loads)
        seconds = host.config.transfer_s(total)
        bs = self.kv.block_size
        for req, n in loads:
            req.notes = (
                *req.notes,
                f"loaded {n * bs} cached prompt tokens ({n} blocks) from the host KV tier; "
                f"the step that scheduled it took {seconds:.6g} s longer",
            )
        ids = tuple(req.request_id for req, _ in loads)
        self.transfers.append(Transfer(self.rep.clock.now(), seconds, total, "admission", ids))
        return seconds

    def finished(self, req: SimRequest) -> None:
        if req.num_cached_cpu_tokens:
            self.cpu_cached_tokens[req.request_id] = req.num_cached_cpu_tokens

    # -- KV hooks --------------------------------------------------------------------------

    def _on_evict(self, hashes: list[int]) -> None:
        self.num_evictions += len(hashes)
        for feed in self._feeds:
            feed.put(Tier.GPU, False, hashes)
        if self.host is not None:
            dropped = self.host.offer(hashes)
            if dropped and len(self.retention):
                self.retention.drop(dropped)
                self._refresh(())
        elif len(self.retention):
            self.retention.drop(hashes)

    def _on_host_change(self, stored: bool, hashes: list[int]) -> None:
        for feed in self._feeds:
            feed.put(Tier.CPU, stored, hashes)

    def _on_cache(self, blocks: np.ndarray, hashes: np.ndarray) -> None:
        host, table = self.host, self.retention
        hv = hashes.tolist()
        for feed in self._feeds:
            feed.put(Tier.GPU, True, hv)
        if host is not None and len(host):
            host.supersede(hv)
        if len(table):
            for b, h in zip(blocks.tolist(), hv, strict=True):
                if h in table:
                    level, prio = table.gpu_level(h)
                    self.kv.set_pin(b, level, prio)

    def reset(self) -> None:
        """The replica's KV cache was dropped (sleep): every tier and pin goes."""
        for feed in self._feeds:
            feed.put(Tier.GPU, None, [])
        self.retention.clear()
        if self.host is not None:
            self.host.clear()
            self.host.set_protection(None)

    # -- state -----------------------------------------------------------------------------

    def state_report(self, hashes: Collection[int] | None = None) -> StateReport:
        """A snapshot of residency, capacity, queues and pressure (reserves nothing).

        With `hashes`, residency covers only those block hashes (those resident, per tier):
        a harness asks about the blocks of the requests it is ordering, and the cost is the
        size of the question, not of a KV pool with ~10^5 resident blocks per tier.
        """
        rep, kv = self.rep, self.kv
        st = rep.state()
        host = self.host
        host_res: tuple[int, ...] = ()
        if hashes is None:
            gpu = tuple(h for _, h in sorted(kv.block_hash.items()))
            if host is not None:
                host_res = tuple(host.hashes())
        else:
            asked = np.fromiter(hashes, dtype=np.uint64, count=len(hashes))
            on_gpu = kv.cached_mask(asked)
            gpu = tuple(asked[on_gpu].tolist())
            if host is not None:
                host_res = tuple(host.resident_among(asked[~on_gpu].tolist()))
        residency = [PrefixRange(gpu, Tier.GPU)]
        capacity = [TierCapacity(Tier.GPU, kv.num_blocks, st.num_free_blocks)]
        costs: list[CostEstimate] = []
        if host is not None:
            residency.append(PrefixRange(host_res, Tier.CPU))
            capacity.append(TierCapacity(Tier.CPU, host.capacity_blocks, host.num_free_blocks))
            per_block = host.config.transfer_s(1)
            costs.append(
                CostEstimate("load_cpu_block", Prediction(per_block, "block_bytes / link_bytes_s"))
            )
        sched = rep.scheduler
        return StateReport(
            subject=InstanceRef(rep.name),
            at_s=rep.clock.now(),
            block_size=kv.block_size,
            residency=tuple(residency),
            capacity=tuple(capacity),
            queue=QueueState(st.num_running, st.num_waiting, sched.num_protected),
            pressure=Pressure(st.kv_usage, sched.num_preemptions_total, self.num_evictions),
            costs=tuple(costs),
        )

    def check_invariants(self) -> None:
        """Tiers exclusive, pins only on resident hashes, GPU pin levels match the table."""
        cached = self.kv.cached
        host = self.host
        if host is not None:
            host.check_invariants()
            both = [h for h in host.hashes() if h in cached]
            if both:
                raise SimulationError(f"{len(both)} hashes are in the GPU and host tiers at once")
        for h in self.retention.hashes():
            if h not in cached and (host is None or h not in host):
                raise SimulationError(f"hash {h} is pinned but resident in no tier")
        for h, b in cached.items():
            level, prio = self.retention.gpu_level(h)
            if int(self.kv.pin_level[b]) != level or (level and self.kv.pin_prio[b] != prio):
                raise SimulationError(f"GPU block {b} pin level disagrees with hash {h}'s pins")
