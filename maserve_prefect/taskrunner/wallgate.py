"""`WallGate`: the clock regime of runs on real engines — wall time, nothing to keep in lockstep.

The one idea: the runner and the ops talk to a gate either way (`maserve_prefect.taskrunner.lockstep`
`Gate` protocol), so the same code runs in virtual time on the simulator and in wall time on real
engines. Under a `WallGate` time is `time.monotonic()` since the gate was built, a blocked thread
simply waits for its wake-up, `sleep` really sleeps, and a deferred action runs at once (in wall
time "the next quiescent instant" is now). Participants are not counted: nothing waits for
quiescence, so `admit` / `leave` only keep a count for diagnostics.

Examples:
    >>> gate = WallGate()
    >>> seen = []
    >>> gate.defer(("k", 1), lambda: seen.append("ran"))
    >>> seen
    ['ran']
    >>> gate.block(lambda wake: wake(), what="already done")
    >>> gate.now() >= 0.0
    True
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

Wake = Callable[[], None]


class WallGate:
    """Gate for wall-clock runs (see the module docstring)."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()
        self._lock = threading.RLock()
        self._count_lock = threading.Lock()
        self.num_active = 0

    def __enter__(self) -> WallGate:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def now(self) -> float:
        """Seconds since the gate was built."""
        return time.monotonic() - self._t0

    def locked(self) -> threading.RLock:
        """The lock under which deferred actions run (engines may share it)."""
        return self._lock

    def admit(self) -> None:
        """Count a participant (diagnostics only; wall time never waits for quiescence)."""
        with self._count_lock:
            self.num_active += 1

    def leave(self) -> None:
        """Uncount a participant."""
        with self._count_lock:
            self.num_active -= 1

    def block(self, register: Callable[[Wake], object], what: str) -> None:
        """Wait until the callback given to `register` is called (at once if it already was)."""
        event = threading.Event()
        with self._lock:
            register(event.set)
        event.wait()

    def sleep(self, dt: float, what: str = "sleep") -> None:
        """Sleep `dt` wall seconds."""
        time.sleep(max(dt, 0.0))

    def defer(self, key: Any, fn: Callable[[], None]) -> None:
        """Run `fn` now, under the gate's lock (the key orders nothing in wall time)."""
        with self._lock:
            fn()
