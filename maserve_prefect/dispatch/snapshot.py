"""What a plan decides on and what it decides: the snapshot in, the decisions out.

One idea: a plan is a pure step function over plain frozen values (vLLM v1's
`schedule() -> SchedulerOutput`): a `Snapshot` — the ready units in the order the dispatcher
heard of them, the near-ready ones, a view of every replica, and where each root's first unit
ran — in, `Decisions` — submits, and for pool plans lifecycle decisions and grants — out. Neither
aliases the dispatcher's live books. A pool plan reads a richer snapshot (`pool.snapshot`), a
subclass of this one.

Examples:
    >>> v = ReplicaView("r0", "m", Lifecycle.READY, num_outstanding=2, max_outstanding=2)
    >>> v.accepting, v.has_room
    (True, False)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from maserve_prefect.protocol.state import Lifecycle


@dataclass(frozen=True, slots=True)
class Unit:
    """A schedulable model call (one op), as plans see it."""

    unit_id: str
    root_id: str
    deployment: str
    num_prompt_tokens: int
    max_tokens: int
    priority: int = 0
    ready_s: float = 0.0
    workflow: str = ""
    session_id: str = ""  # the conversation it continues, when the trace has sessions


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """What a plan knows about one replica: its lifecycle and the dispatcher's load on it.

    Attributes:
        num_outstanding: requests this dispatcher submitted to it that have not finished.
        max_outstanding: the dispatcher's cap on them (None: no cap; a harness's concurrency
            limit per replica, e.g. an agent framework's).
    """

    name: str
    deployment: str
    lifecycle: Lifecycle
    num_outstanding: int = 0
    max_outstanding: int | None = None

    @property
    def accepting(self) -> bool:
        return self.lifecycle.accepting

    def serves(self, deployment: str) -> bool:
        """Whether it serves `deployment` (a replica of deployment "" serves any)."""
        return not self.deployment or self.deployment == deployment

    @property
    def has_room(self) -> bool:
        """Accepting, and under the dispatcher's cap."""
        cap = self.max_outstanding
        return self.lifecycle.accepting and (cap is None or self.num_outstanding < cap)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The immutable input of a plan.

    Attributes:
        ready: ready units in the order the dispatcher heard of them (a plan orders them by its
            own rule).
        near_ready: units whose predecessors are all done or running, by unit id.
        replicas: every replica the dispatcher may submit to, by the pool's order.
        homes: each root's home — the replica its first submitted unit went to.
        session_homes: each session's home — the replica its first submitted unit went to.
        cached_tokens: per ready unit, per replica, the prompt tokens that replica holds cached
            for it now; filled only for plans that ask (`needs_prefix`), from the replicas'
            prefix probes (`dispatch.routes`). A missing entry means 0.
    """

    now_s: float
    ready: tuple[Unit, ...]
    near_ready: tuple[Unit, ...]
    replicas: tuple[ReplicaView, ...]
    homes: Mapping[str, str] = field(default_factory=dict)
    session_homes: Mapping[str, str] = field(default_factory=dict)
    cached_tokens: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Submit:
    """Send a ready unit to a replica now."""

    unit_id: str
    replica: str


@dataclass(frozen=True, slots=True)
class Load:
    """Start a replica of `deployment` on `device` once the named unloads have finished.

    Attributes:
        after: replicas whose `Unload` (in the same decisions) frees the memory this load needs;
            the applier starts the load when every one of them has finished unloading.
        prefetch: loaded ahead of near-ready work (no ready unit waits for it yet).
        units: the demand it serves (ready units, or near-ready units for a prefetch).
    """

    deployment: str
    device: str
    after: tuple[str, ...] = ()
    prefetch: bool = False
    units: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Unload:
    """Reclaim an idle, lease-free replica (`for_deployment`: the load it makes room for)."""

    replica: str
    for_deployment: str = ""


@dataclass(frozen=True, slots=True)
class Grant:
    """Let a unit or a fused chain run on `replica`: the head goes out as a `Submit` now, later
    members go to the same replica as soon as they are ready, and the replica stays leased (not
    reclaimable) until the last member completes."""

    replica: str
    unit_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Decisions:
    """A plan's output: never aliases the snapshot's live state.

    Appliers run unloads first, then loads (a load with `after` waits for those unloads), then
    grants and submits.
    """

    submits: tuple[Submit, ...] = ()
    loads: tuple[Load, ...] = ()
    unloads: tuple[Unload, ...] = ()
    grants: tuple[Grant, ...] = ()
