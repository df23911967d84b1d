"""HEAR category 2 — Execution Requirements & Control: what the harness asks an engine to do.

One idea: a control is the *only* thing that makes an engine act, and each one says how binding
it is. Every control is an engine-seam `Control` (so it rides `Replica.submit(request,
controls)`) with a `force` — PREFERENCE (may be dropped, and the drop is noted) or REQUIREMENT
(honoured, or answered UNSUPPORTED) — and an ordered tuple of explicitly allowed `fallback`
controls. `protocol.force.resolve` applies those rules; engine sides call it instead of re-deriving
them.

The controls:

- scheduling preferences: `Priority` (engine seam; lower first) and `OrderingKey` (lower first
  among equal priority);
- waiting-time requirements: `MaxWait` — once a request has waited `max_wait_s` it is
  *protected* (see `policies.GuardW`);
- cache controls on a versioned context: `CachePrepare` (bring blocks into a tier before use),
  `CacheRetain` (keep them, with a retention priority: higher is evicted later), `CacheRelease`
  (they may go); a state report that blocks are resident reserves nothing — only these do;
- allowed execution configurations: `ExecutionMode` (engine seam; its `fallback` lists other
  allowed modes by name).

Request-scoped controls (`Priority`, `OrderingKey`, `MaxWait`, `ExecutionMode`) take the request
they are submitted with as their subject; cache controls name their `ContextRef`.

Examples:
    >>> ctx = ContextRef("sess-1", 2)
    >>> keep = CacheRetain(ctx, (11, 12), retention_priority=0.8, force=Force.REQUIREMENT,
    ...                    fallback=(CacheRetain(ctx, (11, 12), 0.8, tier=Tier.CPU),))
    >>> keep.force.name, keep.fallback[0].tier.name
    ('REQUIREMENT', 'CPU')
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any

from maserve_prefect.errors import RequestError
from maserve_prefect.protocol.subjects import ContextRef


class Force(IntEnum):
    """How binding a control is."""

    PREFERENCE = 0
    REQUIREMENT = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Control:
    """Base of typed controls: a force and the fallbacks the caller allows (in order)."""

    force: Force = Force.PREFERENCE
    fallback: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class Priority(Control):
    """Run with this scheduling priority (lower first)."""

    value: int


@dataclass(frozen=True, slots=True)
class ExecutionMode(Control):
    """Run in a named execution mode (e.g. "default", "eager"); fallback lists other modes."""

    mode: str


__all__ = [
    "CacheOp",
    "CachePrepare",
    "CacheRelease",
    "CacheRetain",
    "Control",
    "ExecutionMode",
    "Force",
    "MaxWait",
    "OrderingKey",
    "Priority",
    "Tier",
]


class Tier(IntEnum):
    """Where KV blocks live; lower is closer to compute."""

    GPU = 0
    CPU = 1  # host memory


class CacheOp(Enum):
    """The three cache controls an engine may support."""

    PREPARE = "prepare"
    RETAIN = "retain"
    RELEASE = "release"


@dataclass(frozen=True, slots=True)
class OrderingKey(Control):
    """Run earlier than requests with a larger key (among equal priority)."""

    key: float


@dataclass(frozen=True, slots=True)
class MaxWait(Control):
    """After waiting `max_wait_s` seconds the request is protected: it runs ahead of every
    unprotected request."""

    max_wait_s: float

    def __post_init__(self) -> None:
        if not (self.max_wait_s >= 0 and math.isfinite(self.max_wait_s)):
            raise RequestError(
                f"MaxWait: max_wait_s must be finite and >= 0, got {self.max_wait_s}"
            )


def _check_blocks(name: str, subject: ContextRef, block_hashes: tuple[int, ...]) -> None:
    if not isinstance(subject, ContextRef):
        raise RequestError(f"{name}: subject must be a ContextRef, got {subject!r}")
    if not block_hashes:
        raise RequestError(f"{name} for {subject.key()}: name at least one block hash")


@dataclass(frozen=True, slots=True)
class CachePrepare(Control):
    """Make the context's blocks resident in `tier` before its next use."""

    subject: ContextRef
    block_hashes: tuple[int, ...]
    tier: Tier = Tier.GPU

    def __post_init__(self) -> None:
        _check_blocks("CachePrepare", self.subject, self.block_hashes)


@dataclass(frozen=True, slots=True)
class CacheRetain(Control):
    """Keep the context's blocks in `tier` (or a faster one); higher `retention_priority` is
    evicted later. `ttl_s` bounds the pin (None: until released)."""

    subject: ContextRef
    block_hashes: tuple[int, ...]
    retention_priority: float
    tier: Tier = Tier.GPU
    ttl_s: float | None = None

    def __post_init__(self) -> None:
        _check_blocks("CacheRetain", self.subject, self.block_hashes)
        if not math.isfinite(self.retention_priority):
            raise RequestError(
                f"CacheRetain for {self.subject.key()}: retention_priority must be finite"
            )
        if self.ttl_s is not None and not self.ttl_s > 0:
            raise RequestError(f"CacheRetain for {self.subject.key()}: ttl_s must be > 0")


@dataclass(frozen=True, slots=True)
class CacheRelease(Control):
    """The context's blocks may be evicted (all blocks it pinned when `block_hashes` is empty)."""

    subject: ContextRef
    block_hashes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.subject, ContextRef):
            raise RequestError(f"CacheRelease: subject must be a ContextRef, got {self.subject!r}")
