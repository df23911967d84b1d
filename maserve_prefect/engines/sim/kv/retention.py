"""Retention pins on KV block hashes, and the one eviction rule both KV tiers follow.

One idea: a honoured `CacheRetain` pins the named block hashes for its context; the pins change
*which* free cached block a tier gives up when it needs room, never anything else. The rule is
`protocol.fake.ReferenceEngine.evict`'s, applied among a tier's evictable blocks (on the GPU:
the free cached blocks; in the host tier: every resident hash):

1. unpinned blocks first, oldest first (the GPU free queue's LRU order, the host tier's LRU);
2. then blocks pinned by preference only, lowest retention priority first (oldest first among
   equal priorities);
3. blocks pinned by requirement never go: on the GPU they do not count as free for allocation,
   so a request that needs them waits (head-of-line) until a `CacheRelease` or the pin's TTL.

Which pins protect where (a pin's tier means "this tier or a faster one"):
- on the GPU, the pins with tier GPU: any REQUIREMENT one makes the block *hard*, else it is
  *soft* with the highest priority among them; a CPU-tier pin does not hold a block on the GPU
  (moving it down to the host still satisfies it);
- in the host tier, every pin: a GPU-tier preference whose block was evicted still prefers to
  be kept, and a CPU-tier pin is exactly about this tier.

Pins live per (hash, context): several contexts may pin one hash, and a `CacheRelease` removes
only its own context's pins. Pins attach to resident hashes only (a retain keeps what is there;
a prepare loads), follow a hash when it moves between tiers, and go when it leaves every tier,
as the reference engine drops them on eviction.

Examples:
    >>> from maserve_prefect.protocol.controls import Force
    >>> from maserve_prefect.protocol.controls import Tier
    >>> table = RetentionTable()
    >>> _ = table.pin("context:a@0", [7, 8], 0.5, Force.PREFERENCE, Tier.GPU)
    >>> _ = table.pin("context:b@0", [8], 0.9, Force.REQUIREMENT, Tier.GPU)
    >>> table.gpu_level(7), table.gpu_level(8)
    ((1, 0.5), (2, 0.9))
    >>> table.release("context:b@0"), table.gpu_level(8)
    ([8], (1, 0.5))
    >>> soft_order(np.array([0.9, 0.1, 0.5, 0.1])).tolist()
    [1, 3, 2, 0]
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, KeysView, Sequence
from dataclasses import dataclass

import numpy as np

from maserve_prefect.protocol.controls import Force, Tier

NONE, SOFT, HARD = 0, 1, 2  # pin levels


@dataclass(frozen=True, slots=True)
class Pin:
    """One context's hold on one block hash (`gen` tells a TTL which retain set it)."""

    context_key: str
    retention_priority: float
    force: Force
    tier: Tier
    gen: int


def soft_order(prios: np.ndarray) -> np.ndarray:
    """Eviction order of soft-pinned candidates given oldest first: lowest retention priority
    first, oldest first among equal priorities (rule step 2)."""
    return np.argsort(prios, kind="stable")


class RetentionTable:
    """Pins by block hash and by context (see the module docstring)."""

    __slots__ = ("_by_key", "_gen", "_pins")

    def __init__(self) -> None:
        self._pins: dict[int, dict[str, Pin]] = {}  # hash -> context key -> pin
        self._by_key: dict[str, set[int]] = {}  # context key -> hashes it pins
        self._gen = itertools.count(1)

    def __len__(self) -> int:
        """Pinned hashes."""
        return len(self._pins)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._pins

    def hashes(self) -> list[int]:
        return list(self._pins)

    def pins_of(self, block_hash: int) -> tuple[Pin, ...]:
        return tuple(self._pins.get(block_hash, {}).values())

    def pin(
        self,
        context_key: str,
        hashes: Iterable[int],
        retention_priority: float,
        force: Force,
        tier: Tier,
    ) -> int:
        """Pin `hashes` for `context_key` (replacing that context's earlier pins on them);
        returns the pins' generation."""
        gen = next(self._gen)
        pin = Pin(context_key, retention_priority, force, tier, gen)
        mine = self._by_key.setdefault(context_key, set())
        for h in hashes:
            self._pins.setdefault(h, {})[context_key] = pin
            mine.add(h)
        return gen

    def release(self, context_key: str, hashes: Sequence[int] = ()) -> list[int]:
        """Remove `context_key`'s pins on `hashes` (all of its pins when empty); returns the
        hashes whose pins changed."""
        mine = self._by_key.get(context_key)
        if not mine:
            return []
        targets = [h for h in hashes if h in mine] if hashes else sorted(mine)
        for h in targets:
            self._unpin(h, context_key)
        return targets

    def expire(self, context_key: str, hashes: Sequence[int], gen: int) -> list[int]:
        """A TTL ran out: remove `context_key`'s pins on `hashes` still of generation `gen`."""
        targets = [h for h in hashes if self._gen_of(h, context_key) == gen]
        for h in targets:
            self._unpin(h, context_key)
        return targets

    def drop(self, hashes: Iterable[int]) -> None:
        """The hashes left every tier: their pins go."""
        pins = self._pins
        for h in hashes:
            held = pins.pop(h, None)
            if held is not None:
                for key in held:
                    self._forget(key, h)

    def clear(self) -> None:
        self._pins.clear()
        self._by_key.clear()

    def gpu_level(self, block_hash: int) -> tuple[int, float]:
        """(level, priority) protecting the hash's GPU block: GPU-tier pins only."""
        held = self._pins.get(block_hash)
        if not held:
            return NONE, 0.0
        gpu = [p for p in held.values() if p.tier is Tier.GPU]
        if not gpu:
            return NONE, 0.0
        return _level(gpu)

    def host_level(self, block_hash: int) -> tuple[int, float]:
        """(level, priority) protecting the hash in the host tier: every pin."""
        held = self._pins.get(block_hash)
        if not held:
            return NONE, 0.0
        return _level(list(held.values()))

    def pinned_hashes(self) -> KeysView[int]:
        """Every hash some pin holds (a live view: it follows later pins and releases)."""
        return self._pins.keys()

    def hard_cpu_hashes(self) -> set[int]:
        """Hashes a REQUIREMENT pin of tier CPU holds (they must fit the host tier)."""
        return {
            h
            for h, held in self._pins.items()
            if any(p.force is Force.REQUIREMENT and p.tier is Tier.CPU for p in held.values())
        }

    def _gen_of(self, block_hash: int, context_key: str) -> int:
        pin = self._pins.get(block_hash, {}).get(context_key)
        return -1 if pin is None else pin.gen

    def _unpin(self, block_hash: int, context_key: str) -> None:
        held = self._pins.get(block_hash)
        if held is not None and held.pop(context_key, None) is not None and not held:
            del self._pins[block_hash]
        self._forget(context_key, block_hash)

    def _forget(self, context_key: str, block_hash: int) -> None:
        mine = self._by_key.get(context_key)
        if mine is not None:
            mine.discard(block_hash)
            if not mine:
                del self._by_key[context_key]


def _level(pins: list[Pin]) -> tuple[int, float]:
    prio = max(p.retention_priority for p in pins)
    if any(p.force is Force.REQUIREMENT for p in pins):
        return HARD, prio
    return SOFT, prio
