"""The memory ledger: each device's memory as a step function of predicted time.

One idea: a lifecycle decision is safe only if memory stays within capacity at *every* predicted
transition after it, not just now. The ledger walks each device through what the pool holds, the
unloads in flight (freed at their predicted end), the loads waiting for their victims (held from
their predicted start) and the decisions a plan adds as it goes; `fits` asks whether more bytes
from a start time on keep every later transition within capacity (`constructor` builds its
lifecycle options on it).

Examples:
    >>> from maserve_prefect.pool.state import DeviceInfo
    >>> ledger = MemoryLedger(PoolState(0.0, (DeviceInfo("d0", "A100-40GB", 100),), ()))
    >>> ledger.add("d0", 0.0, 60); ledger.release("d0", 5.0, 60, "old")
    >>> ledger.fits("d0", 50, 0.0), ledger.fits("d0", 50, 5.0, ["old"])
    (False, True)
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from maserve_prefect.pool.state import INF, PoolState
from maserve_prefect.protocol.state import Lifecycle


class MemoryLedger:
    """Each device's memory as a step function of predicted time.

    Built from a `PoolState`: what every replica holds now, minus in-flight unloads at their
    predicted end, plus loads waiting for their victims at their predicted start. Plans add
    their own decisions as they go (`add`, `release`) and ask `fits`.

    A release at exactly the instant of an addition is only trusted when the caller names it
    (the addition's own victims, whose unload end starts it); otherwise the ledger assumes the
    addition may come first, which keeps the check conservative.
    """

    def __init__(self, state: PoolState) -> None:
        self.capacity = {d.name: d.capacity_bytes for d in state.devices}
        self._adds: dict[str, list[tuple[float, int]]] = {d: [] for d in self.capacity}
        self._rels: dict[str, list[tuple[float, int, str]]] = {d: [] for d in self.capacity}
        now = state.now_s
        for r in state.replicas:
            if r.held_bytes > 0:
                self.add(r.device, -INF, r.held_bytes)
            if r.lifecycle is Lifecycle.UNLOADING:
                self.release(r.device, max(r.ready_s, now), r.held_bytes, r.name)
        for p in state.planned:
            self.add(p.device, max(p.start_s, now), p.footprint_bytes)

    def copy(self) -> MemoryLedger:
        new = MemoryLedger.__new__(MemoryLedger)
        new.capacity = self.capacity
        new._adds = {d: list(v) for d, v in self._adds.items()}
        new._rels = {d: list(v) for d, v in self._rels.items()}
        return new

    def add(self, device: str, at_s: float, nbytes: int) -> None:
        """`nbytes` held on `device` from `at_s` on."""
        bisect.insort(self._adds[device], (at_s, nbytes))

    def release(self, device: str, at_s: float, nbytes: int, tag: str = "") -> None:
        """`nbytes` freed on `device` at `at_s` (by the replica named `tag`)."""
        bisect.insort(self._rels[device], (at_s, nbytes, tag))

    def usage_at(self, device: str, t: float, trusted: Iterable[str] = ()) -> int:
        """Bytes held at `t`, counting additions at `t` and releases before it (or at it, when
        their tag is trusted)."""
        ok = set(trusted)
        held = sum(b for at, b in self._adds[device] if at <= t)
        freed = sum(b for at, b, tag in self._rels[device] if at < t or (at == t and tag in ok))
        return held - freed

    def headroom(self, device: str, start_s: float, trusted: Iterable[str] = ()) -> int:
        """The least free memory on `device` at any transition from `start_s` on."""
        cap = self.capacity[device]
        trusted = tuple(trusted)
        points = [t for t, _ in self._adds[device] if t > start_s]
        free = cap - self.usage_at(device, start_s, trusted)
        for t in points:
            free = min(free, cap - self.usage_at(device, t))
        return free

    def fits(self, device: str, nbytes: int, start_s: float, trusted: Iterable[str] = ()) -> bool:
        """Whether `nbytes` more from `start_s` on keeps every later transition within capacity."""
        return self.headroom(device, start_s, trusted) >= nbytes

    def releases(self, device: str, from_s: float) -> list[tuple[float, str]]:
        """(time, tag) of the releases on `device` at or after `from_s`, in time order."""
        return [(at, tag) for at, _, tag in self._rels[device] if at >= from_s]
