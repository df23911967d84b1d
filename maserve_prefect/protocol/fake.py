"""A reference HEAR engine side: the smallest engine that obeys the protocol, for tests and specs.

One idea: it does exactly what a real engine side must do, and nothing more —

- `submit` / `control` run `force.resolve` and apply only `Resolution.honoured`; an unsatisfied
  requirement is answered `Unsupported`, an accepted request `Accepted` (not done: `complete`
  gives the `Completed` outcome later);
- `inform` appends to an `IntentLog` that nothing here reads;
- `state` is a snapshot that reserves nothing;
- `evict` is the eviction hook: unpinned blocks go first (oldest first), then blocks retained by
  *preference*, lowest retention priority first; blocks retained by *requirement* never go.

It models block residency only (no compute, no time of its own). The simulator's second KV tier
and eviction hook implement the same contract at full fidelity.

Examples:
    >>> eng = ReferenceEngine("ref", modes=("default",), tiers={Tier.GPU: 4})
    >>> from maserve_prefect.protocol.messages import CacheRetain, ContextRef
    >>> eng.admit_blocks((1, 2, 3))
    >>> ctx = ContextRef("s1", 0)
    >>> res = eng.control([CacheRetain(ctx, (1,), retention_priority=0.9)])
    >>> eng.evict(2)
    [2, 3]
    >>> sorted(eng.resident())
    [1]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from maserve_prefect.errors import RequestError
from maserve_prefect.protocol.capabilities import Capabilities, HearCapabilities
from maserve_prefect.protocol.channel import IntentLog
from maserve_prefect.protocol.controls import (
    CacheOp,
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
from maserve_prefect.protocol.force import Resolution, resolve
from maserve_prefect.protocol.intents import IntentMessage
from maserve_prefect.protocol.outcomes import (
    Accepted,
    CacheReuse,
    Completed,
    Latency,
    Resources,
    Unsupported,
)
from maserve_prefect.protocol.state import PrefixRange, StateReport, TierCapacity
from maserve_prefect.protocol.subjects import InstanceRef, RequestRef


@dataclass(frozen=True, slots=True)
class Pin:
    """One context's hold on a block, from an honoured retain control."""

    context_key: str
    retention_priority: float
    force: Force


class ReferenceEngine:
    """An in-memory engine side honouring HEAR (see the module docstring).

    Args:
        name: the instance name (the subject of its state reports).
        modes: execution modes it can run; the first is the default.
        tiers: KV tiers and their sizes in blocks.
        cache_ops: cache controls it supports.
        block_size: tokens per block.
    """

    def __init__(
        self,
        name: str,
        modes: Sequence[str] = ("default",),
        tiers: Mapping[Tier, int] | None = None,
        cache_ops: Sequence[CacheOp] = (CacheOp.PREPARE, CacheOp.RETAIN, CacheOp.RELEASE),
        block_size: int = 16,
    ) -> None:
        self.name = name
        self.block_size = block_size
        self.tier_sizes = dict(tiers or {Tier.GPU: 64})
        seam = Capabilities(
            control_types=(ExecutionMode, Priority, OrderingKey, MaxWait),
            accepts_token_ids=True,
            length_lock=True,
            priority_scheduling=True,
            prefix_caching=True,
            kv_events=False,
            sleep_levels=(),
            modes=tuple(modes),
        )
        self.capabilities = HearCapabilities.from_engine(
            seam, cache_controls=cache_ops, kv_tiers=self.tier_sizes
        )
        self.intents = IntentLog()
        self._blocks: dict[int, Tier] = {}  # insertion order = age (oldest first)
        self._pins: dict[int, dict[str, Pin]] = {}  # block -> context key -> pin
        self._accepted: dict[str, Accepted] = {}

    # -- the two channels ----------------------------------------------------------------

    def inform(self, intent: IntentMessage) -> None:
        self.intents.inform(intent)

    def submit(
        self, request_id: str, controls: Sequence[Control] = (), at_s: float = 0.0
    ) -> Accepted | Unsupported:
        """Resolve and apply `controls`; answer ACCEPTED (not done) or UNSUPPORTED at once."""
        res = resolve(controls, self.capabilities)
        answer = res.outcome(RequestRef(request_id), at_s, res.realized_mode(self.default_mode))
        if isinstance(answer, Accepted):
            self._apply(res)
            self._accepted[request_id] = answer
        return answer

    def control(self, controls: Sequence[Control]) -> Resolution:
        """Controls outside a submission (retain / release after a turn); applied unless a
        requirement is unsatisfied, in which case nothing is applied."""
        res = resolve(controls, self.capabilities)
        if not res.unsatisfied:
            self._apply(res)
        return res

    def complete(
        self, request_id: str, num_prompt_tokens: int, num_output_tokens: int, finish_s: float
    ) -> Completed:
        """Finish an accepted request (the only way to a `Completed` outcome).

        Raises:
            RequestError: `request_id` was never accepted here.
        """
        acc = self._accepted.pop(request_id, None)
        if acc is None:
            raise RequestError(f"{self.name}: request {request_id!r} is not accepted here")
        start = acc.at_s or 0.0
        return Completed(
            acc.subject,
            acc.realization,
            CacheReuse(num_prompt_tokens, 0),
            Latency(start, start, None, finish_s),
            Resources(num_prompt_tokens, num_output_tokens),
        )

    # -- state and the eviction hook -----------------------------------------------------

    @property
    def default_mode(self) -> str:
        return self.capabilities.modes[0]

    def admit_blocks(self, block_hashes: Sequence[int], tier: Tier = Tier.GPU) -> None:
        """Engine-internal: blocks became resident (e.g. after a prefill)."""
        for h in block_hashes:
            self._blocks.pop(h, None)
            self._blocks[h] = tier

    def resident(self) -> dict[int, Tier]:
        return dict(self._blocks)

    def pinned(self) -> dict[int, tuple[Pin, ...]]:
        """Block hash -> the pins holding it (one per retaining context)."""
        return {h: tuple(pins.values()) for h, pins in self._pins.items() if pins}

    def evict(self, num_blocks: int, tier: Tier = Tier.GPU) -> list[int]:
        """Free up to `num_blocks` blocks of `tier`; returns the evicted hashes, in order."""
        in_tier = [h for h, t in self._blocks.items() if t is tier]
        loose = [h for h in in_tier if not self._pins.get(h)]
        soft = sorted(
            (h for h in in_tier if self._pins.get(h) and not self._hard(h)),
            key=lambda h: max(p.retention_priority for p in self._pins[h].values()),
        )
        victims = (loose + soft)[:num_blocks]
        for h in victims:
            del self._blocks[h]
            self._pins.pop(h, None)
        return victims

    def _hard(self, block_hash: int) -> bool:
        return any(p.force is Force.REQUIREMENT for p in self._pins[block_hash].values())

    def state(self, at_s: float = 0.0) -> StateReport:
        """A snapshot (copies; reserves nothing)."""
        ranges = tuple(
            PrefixRange(tuple(h for h, t in self._blocks.items() if t is tier), tier)
            for tier in sorted(self.tier_sizes)
        )
        capacity = tuple(
            TierCapacity(tier, size, max(0, size - len(r.block_hashes)))
            for (tier, size), r in zip(sorted(self.tier_sizes.items()), ranges, strict=True)
        )
        return StateReport(InstanceRef(self.name), at_s, self.block_size, ranges, capacity)

    def _apply(self, res: Resolution) -> None:
        for c in res.honoured:
            if isinstance(c, CacheRelease):
                self._release(c)
            elif isinstance(c, CachePrepare):
                self.admit_blocks(c.block_hashes, c.tier)
            elif isinstance(c, CacheRetain):
                key = c.subject.key()
                for h in c.block_hashes:
                    if h in self._blocks:  # a retain keeps what is there; prepare loads
                        self._pins.setdefault(h, {})[key] = Pin(key, c.retention_priority, c.force)

    def _release(self, c: CacheRelease) -> None:
        key = c.subject.key()
        hashes = c.block_hashes or tuple(self._pins)
        for h in hashes:
            pins = self._pins.get(h)
            if pins is not None:
                pins.pop(key, None)
                if not pins:
                    del self._pins[h]
