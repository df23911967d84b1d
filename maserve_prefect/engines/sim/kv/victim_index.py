"""The host tier's eviction order under retention pins, kept incrementally.

One idea: the retention rule (`retention.py`) picks host-tier victims as unpinned hashes oldest
first, then preference-pinned ones by lowest retention priority (oldest first among equal),
never requirement-pinned ones. Scanning the whole tier for that at every store is quadratic once
most hashes carry a pin — as they do when every session's context is ranked by a continuation
forecast (HEAR Session-Aware): a Mooncake hour spent most of its time there. `VictimIndex` keeps
the same order in two heaps instead — loose hashes by age, soft-pinned ones by (priority, age) —
where age is a stamp that grows with every store or move to the LRU's end (so stamp order is the
LRU order). Entries are never updated in place: a change pushes a new entry and an entry counts
only while its stamp is the hash's current one and its level and priority are the hash's
current ones (checked when it surfaces), so the order is exactly the scan's. The heaps are
rebuilt when stale entries outnumber live ones three to one.

Examples:
    >>> levels = {2: (1, 0.5), 3: (1, 0.1)}  # hash -> (level, priority); others unpinned
    >>> idx = VictimIndex(lambda h: levels.get(h, (0, 0.0)))
    >>> idx.build([1, 2, 3, 4])  # oldest first
    >>> idx.evict(3)  # the two unpinned ones, then the lowest priority
    [1, 4, 3]
    >>> len(idx)
    1
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable

from maserve_prefect.engines.sim.kv.retention import HARD, NONE, SOFT

__all__ = ["VictimIndex"]

Protect = Callable[[int], tuple[int, float]]


class VictimIndex:
    """Victim order of resident hashes under a `protect` rule (module docstring).

    Args:
        protect: hash -> (pin level, retention priority), the table's current answer.
    """

    __slots__ = ("_loose", "_soft", "_stamp", "_tick", "protect")

    def __init__(self, protect: Protect) -> None:
        self.protect = protect
        self._stamp: dict[int, int] = {}  # resident hash -> its current age stamp
        self._loose: list[tuple[int, int]] = []  # (stamp, hash)
        self._soft: list[tuple[float, int, int]] = []  # (priority, stamp, hash)
        self._tick = itertools.count()

    def __len__(self) -> int:
        return len(self._stamp)

    def build(self, hashes_oldest_first: Iterable[int]) -> None:
        """Index every resident hash (the LRU, oldest first), replacing what was indexed."""
        tick = self._tick
        self._stamp = {h: next(tick) for h in hashes_oldest_first}
        self._rebuild()

    def _rebuild(self) -> None:
        self._loose, self._soft = [], []
        for h, s in self._stamp.items():
            self._push(h, s)
        heapq.heapify(self._loose)
        heapq.heapify(self._soft)

    def _push(self, h: int, s: int) -> None:
        level, prio = self.protect(h)
        if level == NONE:
            self._loose.append((s, h))
        elif level != HARD:
            self._soft.append((prio, s, h))

    def stored(self, hashes: Iterable[int]) -> None:
        """`hashes` were stored or moved to the LRU's end, in that order."""
        tick, stamp = self._tick, self._stamp
        for h in hashes:
            stamp[h] = next(tick)
            self._index(h, stamp[h])
        self._maybe_compact()

    def removed(self, hashes: Iterable[int]) -> None:
        """`hashes` left the tier (loaded, superseded, dropped)."""
        pop = self._stamp.pop
        for h in hashes:
            pop(h, None)
        self._maybe_compact()

    def repinned(self, hashes: Iterable[int]) -> None:
        """The pins of `hashes` changed: index them by their level and priority now."""
        stamp = self._stamp
        for h in hashes:
            s = stamp.get(h)
            if s is not None:
                self._index(h, s)
        self._maybe_compact()

    def _index(self, h: int, s: int) -> None:
        """Index `h` (stamp `s`) by its pin level and priority now; a hard pin is never a
        victim, so it is not indexed (stale entries are skipped when popped)."""
        level, prio = self.protect(h)
        if level == NONE:
            heapq.heappush(self._loose, (s, h))
        elif level != HARD:
            heapq.heappush(self._soft, (prio, s, h))

    def evict(self, n: int) -> list[int]:
        """Take the `n` hashes the rule evicts first, in order, out of the index (fewer when
        only requirement pins are left); the caller removes them from the tier."""
        out: list[int] = []
        stamp, protect = self._stamp, self.protect
        loose, soft = self._loose, self._soft
        while len(out) < n and loose:
            s, h = heapq.heappop(loose)
            if stamp.get(h) != s or protect(h)[0] != NONE:
                continue  # stale: moved, gone, taken, or pinned since
            out.append(h)
            del stamp[h]
        while len(out) < n and soft:
            prio, s, h = heapq.heappop(soft)
            if stamp.get(h) != s or protect(h) != (SOFT, prio):
                continue
            out.append(h)
            del stamp[h]
        return out

    def _maybe_compact(self) -> None:
        if len(self._loose) + len(self._soft) > 3 * len(self._stamp) + 1024:
            self._rebuild()
