"""The Clock seam: the only way dispatcher, policies, replay and engines read or wait on time.

Two implementations share one protocol: `VirtualClock` (the discrete-event kernel, the default;
deterministic) and `WallClock` (asyncio's loop, optionally paced so that one simulated second takes
`scale` wall seconds). Code written against `Clock` — `now()`, `call_at`, `call_later`,
`await clock.sleep(dt)`, `clock.create_future()` — runs unchanged under either; nothing else in
the project calls `time.time()`.

Examples:
    >>> import asyncio
    >>> async def main():
    ...     clock = WallClock(scale=0.001)      # 1 simulated second = 1 ms
    ...     await clock.sleep(1.0)
    ...     return clock.now() >= 1.0
    >>> asyncio.run(main())
    True
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from maserve_prefect.clock.kernel import LATE, NORMAL, URGENT, Handle, Kernel
from maserve_prefect.errors import ConfigError

VirtualClock = Kernel

__all__ = [
    "LATE",
    "NORMAL",
    "URGENT",
    "Cancellable",
    "Clock",
    "ClockFuture",
    "Handle",
    "VirtualClock",
    "WallClock",
]


class Cancellable(Protocol):
    """What `call_at` returns."""

    def cancel(self) -> None: ...


class ClockFuture(Protocol):
    """A one-shot result both clocks can create and await (asyncio.Future-like)."""

    def set_result(self, value: Any) -> None: ...

    def set_exception(self, exc: BaseException) -> None: ...

    def done(self) -> bool: ...

    def result(self) -> Any: ...

    def __await__(self) -> Any: ...


class Clock(Protocol):
    """Time as every component sees it (seconds since the clock's origin).

    `priority` orders callbacks due at the same instant on the virtual clock (URGENT < NORMAL <
    LATE); the wall clock runs same-instant callbacks in scheduling order.
    """

    def now(self) -> float: ...

    def call_at(
        self, t: float, fn: Callable[[], object], priority: int = NORMAL, name: str = ""
    ) -> Cancellable: ...

    def call_later(
        self, dt: float, fn: Callable[[], object], priority: int = NORMAL, name: str = ""
    ) -> Cancellable: ...

    def sleep(self, dt: float) -> Awaitable[None]: ...

    def create_future(self) -> ClockFuture: ...


class WallClock:
    """asyncio-backed clock; `scale` wall seconds per clock second (1.0 = real time).

    Must be created and used inside a running event loop.

    Args:
        scale: wall seconds per simulated second, > 0 (0.01 runs 100x faster than real time).
    """

    def __init__(self, scale: float = 1.0) -> None:
        if not scale > 0:
            raise ConfigError(f"WallClock(scale={scale}): scale must be > 0")
        self.scale = float(scale)
        self._loop = asyncio.get_running_loop()
        self._origin = self._loop.time()

    def now(self) -> float:
        return (self._loop.time() - self._origin) / self.scale

    def call_at(
        self, t: float, fn: Callable[[], object], priority: int = NORMAL, name: str = ""
    ) -> asyncio.TimerHandle:
        return self._loop.call_at(self._origin + t * self.scale, fn)

    def call_later(
        self, dt: float, fn: Callable[[], object], priority: int = NORMAL, name: str = ""
    ) -> asyncio.TimerHandle:
        return self._loop.call_later(max(dt, 0.0) * self.scale, fn)

    async def sleep(self, dt: float) -> None:
        await asyncio.sleep(max(dt, 0.0) * self.scale)

    def create_future(self) -> asyncio.Future[Any]:
        return self._loop.create_future()
