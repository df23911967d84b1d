"""HEAR category 3 — State & Capabilities: what an engine reports about itself.

One idea: state is a *photograph*, never a promise. A `StateReport` says which prefix blocks were
resident in which tier (GPU / CPU host), how full each tier was, the queues, the pressure and cost
estimates, at one instant. It reserves nothing: a block reported resident may be evicted a moment
later. A harness that needs a block kept sends a `CacheRetain` / `CachePrepare` control.
Supported controls and configurations are reported by `protocol.capabilities.HearCapabilities`.

`ResidencyView` is the read-only view the policies use: block hash -> best tier, and the length of
a request's reusable prefix (the leading run of its blocks resident in any tier — prefix caching
can only reuse a contiguous prefix).

Examples:
    >>> view = ResidencyView.of({1: Tier.GPU, 2: Tier.CPU, 4: Tier.GPU}, block_size=16)
    >>> view.reusable_blocks((1, 2, 3, 4))
    2
    >>> view.reusable_by_tier((1, 2, 3, 4))
    {<Tier.GPU: 0>: 1, <Tier.CPU: 1>: 1}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from types import MappingProxyType

from maserve_prefect.errors import RequestError
from maserve_prefect.protocol.controls import Tier
from maserve_prefect.protocol.intents import Prediction
from maserve_prefect.protocol.subjects import ContextRef, InstanceRef


class Lifecycle(IntEnum):
    """Where a replica is in its life, ordered from serving to gone (vLLM's `RequestStatus` idea).

    The one lifecycle of the seam: the simulator's pool, the vLLM process pool, the OpenAI
    client and the pool runtime all speak it. READY is the only state that takes new requests;
    the transitions (LOADING, WAKING, FALLING_ASLEEP, UNLOADING) end in a stable state; from
    UNLOADED on a replica is dead: nothing will be served again without outside action.

    Examples:
        >>> Lifecycle.READY.accepting, Lifecycle.WAKING.becoming_ready, Lifecycle.STOPPED.is_dead
        (True, True, True)
        >>> sorted([Lifecycle.FAILED, Lifecycle.LOADING, Lifecycle.READY])[0].label
        'ready'
    """

    READY = 0
    """Serving; takes new requests."""
    DRAINING = 1
    """Finishing what it holds; takes nothing new."""
    PAUSED = 2
    """Holds its requests; starts no new engine step."""
    LOADING = 3
    WAKING = 4
    FALLING_ASLEEP = 5
    ASLEEP = 6
    """Weights kept (level 1) or dropped (level 2) off the device's KV; must be woken first."""
    UNLOADING = 7
    UNLOADED = 8
    STOPPED = 9
    UNREACHABLE = 10
    FAILED = 11

    @property
    def label(self) -> str:
        """Lower-case name, as tables and error messages print it."""
        return self.name.lower()

    @property
    def accepting(self) -> bool:
        return self is Lifecycle.READY

    @property
    def becoming_ready(self) -> bool:
        """Loading or waking: READY when the transition ends."""
        return self is Lifecycle.LOADING or self is Lifecycle.WAKING

    @property
    def sleeping(self) -> bool:
        """Falling asleep or asleep: holds its weights, serves nothing until woken."""
        return self is Lifecycle.FALLING_ASLEEP or self is Lifecycle.ASLEEP

    @property
    def in_transition(self) -> bool:
        return (
            self.becoming_ready or self is Lifecycle.FALLING_ASLEEP or self is Lifecycle.UNLOADING
        )

    @property
    def is_dead(self) -> bool:
        """Nothing will be served again without outside action (unloaded, stopped, ...)."""
        return self >= Lifecycle.UNLOADED


@dataclass(frozen=True, slots=True)
class EngineState:
    """A snapshot of one replica (never aliases live state)."""

    name: str
    deployment: str
    lifecycle: Lifecycle
    num_running: int
    num_waiting: int
    kv_usage: float
    num_free_blocks: int
    num_total_blocks: int
    block_size: int
    counters: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """One device's memory as a Pool reports it."""

    device: str
    total_bytes: int
    used_bytes: int
    residents: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PrefixRange:
    """A run of resident prefix blocks in one tier (`subject` when the engine knows the context)."""

    block_hashes: tuple[int, ...]
    tier: Tier
    subject: ContextRef | None = None


@dataclass(frozen=True, slots=True)
class TierCapacity:
    """One KV tier's size and free space, in blocks."""

    tier: Tier
    num_total_blocks: int
    num_free_blocks: int

    def __post_init__(self) -> None:
        if not 0 <= self.num_free_blocks <= self.num_total_blocks:
            raise RequestError(
                f"TierCapacity {self.tier.name}: need 0 <= num_free_blocks <= num_total_blocks, "
                f"got {self.num_free_blocks} / {self.num_total_blocks}"
            )


@dataclass(frozen=True, slots=True)
class QueueState:
    """Requests running, waiting, and waiting under protection (see `policies.GuardW`)."""

    num_running: int
    num_waiting: int
    num_protected: int = 0


@dataclass(frozen=True, slots=True)
class Pressure:
    """How hard the engine is pushed: KV use in [0, 1] and recent preemptions / evictions."""

    kv_usage: float
    num_preemptions: int = 0
    num_evictions: int = 0


@dataclass(frozen=True, slots=True)
class CostEstimate:
    """The engine's forecast of one operation's cost (e.g. "prefill_1k", "load_cpu_block")."""

    op: str
    seconds: Prediction[float]


@dataclass(frozen=True, slots=True)
class StateReport:
    """One instance's state at `at_s` (engine clock). Reserves nothing; see the module docstring."""

    subject: InstanceRef
    at_s: float
    block_size: int
    residency: tuple[PrefixRange, ...] = ()
    capacity: tuple[TierCapacity, ...] = ()
    queue: QueueState = QueueState(0, 0)
    pressure: Pressure = Pressure(0.0)
    costs: tuple[CostEstimate, ...] = ()

    def residency_view(self) -> ResidencyView:
        """The report's residency as a policy view (the faster tier wins for a block in both)."""
        tiers: dict[int, Tier] = {}
        for rng in self.residency:
            for h in rng.block_hashes:
                old = tiers.get(h)
                tiers[h] = rng.tier if old is None else min(old, rng.tier)
        return ResidencyView.of(tiers, self.block_size)


@dataclass(frozen=True, slots=True)
class ResidencyView:
    """Read-only block residency: block hash -> tier. Build with `ResidencyView.of`."""

    tiers: Mapping[int, Tier] = field(default_factory=lambda: MappingProxyType({}))
    block_size: int = 16

    @classmethod
    def of(cls, tiers: Mapping[int, Tier], block_size: int) -> ResidencyView:
        """A view over a private copy of `tiers` (never aliases the engine's live map).

        Raises:
            RequestError: `block_size` < 1.
        """
        if block_size < 1:
            raise RequestError(f"ResidencyView: block_size must be >= 1, got {block_size}")
        return cls(MappingProxyType(dict(tiers)), block_size)

    def tier_of(self, block_hash: int) -> Tier | None:
        return self.tiers.get(block_hash)

    def reusable_blocks(self, block_hashes: Sequence[int]) -> int:
        """How many leading blocks of `block_hashes` are resident in any tier."""
        n = 0
        for h in block_hashes:
            if h not in self.tiers:
                break
            n += 1
        return n

    def reusable_by_tier(self, block_hashes: Sequence[int]) -> dict[Tier, int]:
        """The reusable leading blocks split by the tier they sit in."""
        out: dict[Tier, int] = {}
        for h in block_hashes[: self.reusable_blocks(block_hashes)]:
            tier = self.tiers[h]
            out[tier] = out.get(tier, 0) + 1
        return out
