"""The judging half of the simulator's HEAR side: which controls a replica honours, and why not.

One idea: `HearResolver` (the base of `hear.side.SimHear`) answers the way
`protocol.fake.ReferenceEngine` does — `protocol.force.resolve` against the replica's
`HearCapabilities` — and then checks what the KV state allows, for the control resolve chose
(fallbacks are chosen by support, not re-chosen here):
- a REQUIREMENT retain needs every named block resident in its tier or a faster one (a retain
  keeps what is there; send `CachePrepare` first), and CPU-tier requirement pins must fit the
  host tier; a REQUIREMENT prepare needs every block resident somewhere (it moves blocks from
  the host tier, it cannot compute them) and, for the GPU, room for them;
- a PREFERENCE retain or prepare that would do nothing (no named block resident; nothing in the
  host tier to load) is dropped with a "no-op" reason, so the answer says so;
- request-scoped controls (`Priority`, `ExecutionMode`, `OrderingKey`, `MaxWait`) sent to
  `control()` without a request are not honoured ("send it with submit()").
A requirement that fails a check is unsatisfied (UNSUPPORTED, nothing applied); a preference is
dropped (noted). Judging changes nothing: a submission's honoured controls become a `SubmitPlan`
that the replica applies, and `SimHear` applies honoured cache controls.

The per-request notes keep the wording the simulator always used ("fell back", "ignored"), so
outcomes read the same.

Examples:
    >>> from maserve_prefect.protocol.controls import Force
    >>> from maserve_prefect.clock.kernel import Kernel
    >>> from maserve_prefect.engines.sim.replica import SimReplica
    >>> from maserve_prefect.engines.sim.cost.step_time import make_step_model
    >>> from maserve_prefect.protocol.subjects import ContextRef
    >>> rep = SimReplica(Kernel(), make_step_model("Qwen3-0.6B", "H100"), num_gpu_blocks=64)
    >>> keep = CacheRetain(ContextRef("s"), (7,), 0.5, force=Force.REQUIREMENT)
    >>> rep.hear.resolve([keep], request_scoped=False).unsatisfied[0].reason.split(";")[0]
    '1 of its 1 blocks are not resident in GPU or a faster tier'
    >>> rep.hear.resolve([MaxWait(1.0)], request_scoped=False).dropped[0].reason
    'it applies to one request; send it with submit()'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from maserve_prefect.clock import Clock
from maserve_prefect.protocol.capabilities import Capabilities, HearCapabilities
from maserve_prefect.protocol.controls import (
    CachePrepare,
    CacheRelease,
    CacheRetain,
    Control,
    ExecutionMode,
    Force,
    MaxWait,
    OrderingKey,
    Priority,
    Tier,
)
from maserve_prefect.protocol.force import Dropped, Resolution, Unsatisfied, resolve
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.state import EngineState

if TYPE_CHECKING:
    from maserve_prefect.engines.sim.kv.host_tier import HostTier
    from maserve_prefect.engines.sim.kv.manager import KVCacheManager
    from maserve_prefect.engines.sim.kv.retention import RetentionTable
    from maserve_prefect.engines.sim.step.scheduler import Scheduler


class HearHost(Protocol):
    """What the HEAR side reads of the replica it serves (`SimReplica` is the one host); a
    protocol, so this layer never imports the replica that builds it."""

    name: str
    modes: tuple[str, ...]
    kv: KVCacheManager
    scheduler: Scheduler

    @property
    def clock(self) -> Clock: ...

    def state(self) -> EngineState: ...

    def capabilities(self) -> Capabilities: ...

    def kv_effect(self, fn: Callable[[], None]) -> None: ...


_REQUEST_SCOPED = (Priority, ExecutionMode, OrderingKey, MaxWait)
_CACHE = (CachePrepare, CacheRetain, CacheRelease)


@dataclass(frozen=True, slots=True)
class SubmitPlan:
    """What a submission's honoured controls set, and its notes."""

    priority: int
    mode: str
    ordering_key: float
    max_wait_s: float | None
    cache: tuple[Control, ...]
    notes: tuple[str, ...]


def submit_notes(res: Resolution) -> tuple[str, ...]:
    """A resolution's fallbacks and drops in the simulator's outcome wording."""
    out: list[str] = []
    for f in res.fallbacks:
        req, used = f.requested, f.used
        if isinstance(req, ExecutionMode) and isinstance(used, ExecutionMode):
            out.append(f"mode {req.mode!r} unsupported; fell back to {used.mode!r}")
        else:
            out.append(f"{req!r} cannot be honoured; fell back to {used!r}")
    out += [f"preference {d.control!r} not honoured: {d.reason}; ignored" for d in res.dropped]
    return tuple(out)


class HearResolver:
    """Judges controls for one replica (see the module docstring); applies nothing.

    The base of `hear.side.SimHear`, whose constructor sets the attributes declared here.
    """

    rep: HearHost
    kv: KVCacheManager
    host: HostTier | None
    retention: RetentionTable
    capabilities: HearCapabilities

    def resolve(self, controls: Sequence[Control], request_scoped: bool) -> Resolution:
        """`force.resolve`, then the KV-state checks (module docstring)."""
        res = resolve(controls, self.capabilities)
        requested = {id(f.used): f.requested for f in res.fallbacks}
        honoured: list[Control] = []
        fallbacks = list(res.fallbacks)
        dropped = list(res.dropped)
        unsatisfied = list(res.unsatisfied)
        memo: list[set[int]] = []

        def hard_cpu() -> set[int]:  # only a CPU-tier requirement retain needs it: once
            if not memo:
                memo.append(self.retention.hard_cpu_hashes())
            return memo[0]

        for c in res.honoured:
            why = self._cannot(c, request_scoped, hard_cpu)
            if not why:
                honoured.append(c)
                continue
            orig = requested.get(id(c), c)
            fallbacks = [f for f in fallbacks if f.used is not c]
            if c.force is Force.REQUIREMENT:
                unsatisfied.append(Unsatisfied(orig, why))
            else:
                dropped.append(Dropped(orig, why))
        return Resolution(tuple(honoured), tuple(fallbacks), tuple(dropped), tuple(unsatisfied))

    def plan_submit(self, request: Request, controls: Sequence[Control]) -> SubmitPlan | str:
        """A submission's plan, or the UNSUPPORTED reason."""
        res = self.resolve(controls, request_scoped=True)
        if res.unsatisfied:
            return f"{self.rep.name}: {res.reason}"
        prio = res.honoured_of(Priority)
        keys = res.honoured_of(OrderingKey)
        waits = res.honoured_of(MaxWait)
        return SubmitPlan(
            priority=prio[0].value if prio else request.priority,
            mode=res.realized_mode(self.rep.modes[0]),
            ordering_key=keys[0].key if keys else 0.0,
            max_wait_s=waits[0].max_wait_s if waits else None,
            cache=tuple(c for c in res.honoured if isinstance(c, _CACHE)),
            notes=submit_notes(res),
        )

    def _cannot(self, c: Control, request_scoped: bool, hard_cpu: Callable[[], set[int]]) -> str:
        if isinstance(c, _REQUEST_SCOPED):
            return "" if request_scoped else "it applies to one request; send it with submit()"
        if isinstance(c, CacheRetain):
            return self._cannot_retain(c, hard_cpu)
        if isinstance(c, CachePrepare):
            return self._cannot_prepare(c)
        return ""

    def _where(self, h: int) -> Tier | None:
        if self.kv.block_of(h) >= 0:
            return Tier.GPU
        if self.host is not None and h in self.host:
            return Tier.CPU
        return None

    def _cannot_retain(self, c: CacheRetain, hard_cpu: Callable[[], set[int]]) -> str:
        where = [self._where(h) for h in c.block_hashes]
        n = len(where)
        if c.force is Force.REQUIREMENT:
            missing = sum(w is None or w > c.tier for w in where)
            if missing:
                return (
                    f"{missing} of its {n} blocks are not resident in {c.tier.name} or a faster "
                    "tier; a retain keeps what is there (send CachePrepare first)"
                )
            if c.tier is Tier.CPU and self.host is not None:
                total = len(hard_cpu() | set(c.block_hashes))
                if total > self.host.capacity_blocks:
                    return (
                        f"requirement pins on {total} blocks exceed the host tier's "
                        f"{self.host.capacity_blocks} blocks"
                    )
            return ""
        if all(w is None for w in where):
            return f"no-op: none of its {n} blocks is resident in any tier"
        return ""

    def _cannot_prepare(self, c: CachePrepare) -> str:
        where = [self._where(h) for h in c.block_hashes]
        absent = sum(w is None for w in where)
        on_host = sum(w is Tier.CPU for w in where)
        if c.force is Force.REQUIREMENT:
            if absent:
                return (
                    f"{absent} of its {len(where)} blocks are resident in no tier; a prepare "
                    "moves blocks from the host tier, it cannot compute them"
                )
            if c.tier is Tier.GPU and on_host > self.kv.num_free_blocks:
                return (
                    f"{on_host} blocks to load but {self.kv.num_free_blocks} GPU blocks can be "
                    "allocated now"
                )
            return ""
        if c.tier is Tier.CPU or not on_host:
            return (
                f"no-op: nothing to load from the host tier ({len(where) - absent - on_host} "
                f"blocks on the GPU already, {absent} in no tier)"
            )
        return ""
