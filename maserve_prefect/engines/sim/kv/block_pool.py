"""The block pool under the simulated KV cache: reference counts, the LRU free queue and
retention pins, following vLLM v1's `BlockPool` + `FreeKVCacheBlockQueue`.

Free blocks sit in an LRU queue: taking a block pops the front and evicts that block's hash if
it had one (the `HashIndex` of `kv/hash_index.py`, which the pool owns and the prefix cache layered on
it, `kv/prefix_cache.py`, queries); a prefix hit on a free cached block "touches" it (takes it out
of the queue). Freed blocks join the tail in the order given.

The speed idea: the queue holds whole *segments* (one numpy array of block ids per `free` call)
instead of single blocks, so freeing a request or allocating a long prompt costs a few numpy
calls, not a dict operation per block. A touched block is removed lazily: `_where[b]` names the
segment it sits in (-1 when it is not free) and a segment entry counts only while it matches.
The observable behaviour (which block is taken next, which hash is evicted) is exactly the
per-block LRU's; `tests/factories/kv_reference.py` keeps that per-block version and a differential
property test holds the two together. `free_queue` gives the canonical view (built on demand,
for tests and checks).

Retention pins (`retention.py`, a HEAR hook, inert until used): per-block pin levels; while any
pinned block is free, taking free blocks follows the retention rule (`_pop_pinned`), and
requirement-pinned free blocks do not count in `num_free_blocks` / `usage` (they cannot be
allocated). `on_evict` receives the hashes the pool evicts (the host tier's feed).

Examples:
    >>> pool = BlockPool(num_blocks=4)
    >>> pool.free_queue, pool.num_free_blocks
    ([0, 1, 2, 3], 4)
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable

import numpy as np

from maserve_prefect.engines.sim.kv.hash_index import HashIndex
from maserve_prefect.engines.sim.kv.retention import HARD, NONE, SOFT, soft_order
from maserve_prefect.errors import SimulationError

MAX_SCALAR_BLOCKS = 4  # at most this many blocks: plain Python beats numpy's per-call overhead
NO_BLOCKS = np.zeros(0, dtype=np.int64)  # shared empty result (never written)


class BlockPool:
    """Reference counts, the LRU free queue and pins of `num_blocks` KV blocks.

    The base of `PrefixCache` (`kv/prefix_cache.py`) and `KVCacheManager` (`kv/manager.py`), which
    take and free blocks through `_pop_free` / `_pop_free_array` and `_push_free`.

    Args:
        num_blocks: KV capacity in blocks (> 0; `PrefixCache` checks it).
    """

    # set (on the instance) by the first pin: until then freeing skips the pin counts; a class
    # default, so the instance keeps its attribute count (see `KVCacheManager.__init__`)
    _pins_used = False

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.ref_cnt = np.zeros(num_blocks, dtype=np.int64)
        self._idx = HashIndex(num_blocks)  # hash <-> block of the cached blocks
        self.max_queue_entries = 2 * num_blocks + 64  # then `_compact_queue`
        # HEAR hooks (`kv/manager.py`); None / zero while unused
        self.on_evict: Callable[[list[int]], None] | None = None
        self.pin_level = np.zeros(num_blocks, dtype=np.int8)  # NONE / SOFT / HARD
        self.pin_prio = np.zeros(num_blocks, dtype=np.float64)
        self._num_pinned_free = 0  # pinned blocks on the free queue
        self._num_hard_free = 0  # of them HARD: never allocatable
        self._reset_queue()

    def _reset_queue(self) -> None:
        self._sid = itertools.count(1)
        # each segment: [block ids in queue order, offset of the first unread entry, segment id]
        self._segs: deque[list] = deque([[np.arange(self.num_blocks, dtype=np.int64), 0, 0]])
        self._where = np.zeros(self.num_blocks, dtype=np.int64)  # segment id, -1 = not free
        # segments holding stale entries (touched blocks); the others are read without a check
        self._stale_sids: set[int] = set()
        self._num_free = self.num_blocks
        # entries in the segments, stale ones (touched blocks) included; bounded by compaction
        self._num_entries = self.num_blocks

    # -- views -----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Free blocks an allocation may take (requirement-pinned free blocks excluded)."""
        return self._num_free - self._num_hard_free

    @property
    def usage(self) -> float:
        return 1.0 - (self._num_free - self._num_hard_free) / self.num_blocks

    @property
    def num_hard_pinned_free(self) -> int:
        """Free blocks held back by requirement pins."""
        return self._num_hard_free

    @property
    def free_queue(self) -> list[int]:
        """Free block ids, least recently freed first (the eviction order)."""
        out: list[int] = []
        where = self._where
        for arr, off, sid in self._segs:
            rest = arr[off:]
            out.extend(rest[where[rest] == sid].tolist())
        return out

    # -- taking and freeing blocks ---------------------------------------------------------

    def _pop_free(self, n: int) -> list[int]:
        """Take the `n` least recently freed blocks, evicting their hashes (they get new tokens)."""
        if n > MAX_SCALAR_BLOCKS:
            return self._pop_free_array(n).tolist()
        if self._num_pinned_free:
            return self._pop_pinned(n).tolist()
        self._num_free -= n
        segs, where = self._segs, self._where
        taken: list[int] = []
        evicted: list[int] | None = None if self.on_evict is None else []
        while len(taken) < n:
            seg = segs[0]
            arr, off, sid = seg
            if off >= len(arr):
                self._num_entries -= len(segs.popleft()[0])
                continue
            b = int(arr[off])
            seg[1] = off + 1
            if where[b] == sid:
                taken.append(b)
                where[b] = -1
                self.ref_cnt[b] = 1
                if evicted is not None and self._idx.hashed[b]:
                    evicted.append(int(self._idx.hash_val[b]))
                self._idx.evict_one(b)
        if evicted:
            self.on_evict(evicted)  # type: ignore[misc]
        return taken

    def _pop_free_array(self, n: int) -> np.ndarray:
        """`_pop_free` for n > `MAX_SCALAR_BLOCKS`, as an int64 array."""
        if self._num_pinned_free:
            return self._pop_pinned(n)
        self._num_free -= n
        segs, where = self._segs, self._where
        seg = segs[0]
        arr, off, sid = seg
        if off + n <= len(arr) and sid not in self._stale_sids:  # one clean segment holds them
            got = arr[off : off + n]
            seg[1] = off + n
        else:
            got = self._take_segments(n)
        where[got] = -1
        self.ref_cnt[got] = 1
        if self.on_evict is not None:
            self._emit_evictions(got)
        self._idx.hashed[got] = False  # its hash is no longer cached (`HashIndex.evict`)
        return got

    def _take_segments(self, n: int) -> np.ndarray:
        """The next `n` live entries of the queue, across segments (the queue's offsets move
        past them; `where` and the counts are the caller's)."""
        segs, where = self._segs, self._where
        parts = []
        need = n
        while need:
            seg = segs[0]
            arr, off, sid = seg
            if off >= len(arr):
                self._num_entries -= len(segs.popleft()[0])
                continue
            window = arr[off : off + need]
            seg[1] = off + len(window)
            live = window[where.take(window) == sid] if sid in self._stale_sids else window
            parts.append(live)
            need -= len(live)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _emit_evictions(self, got: np.ndarray) -> None:
        idx = self._idx
        gone = idx.hash_val[got][idx.hashed[got]]
        if len(gone):
            self.on_evict(gone.tolist())  # type: ignore[misc]

    def _pop_pinned(self, n: int) -> np.ndarray:
        """Take `n` free blocks by the retention rule (`retention.py`): unpinned ones in queue
        order, then soft-pinned ones by lowest priority (oldest first among equal), never hard
        ones. Pinned blocks passed over keep their order in a segment at the queue's front."""
        segs, where, level = self._segs, self._where, self.pin_level
        parts: list[np.ndarray] = []
        kept: list[np.ndarray] = []
        need = n
        while need and segs:
            seg = segs[0]
            arr, off, sid = seg
            window = arr[off:]
            live = where[window] == sid
            loose = live & (level[window] == NONE)
            cum = np.cumsum(loose)
            total = int(cum[-1]) if len(cum) else 0
            if total <= need:
                parts.append(window[loose])
                kept.append(window[live & ~loose])
                need -= total
                self._num_entries -= len(segs.popleft()[0])
            else:
                cut = int(np.searchsorted(cum, need)) + 1  # through the need-th loose block
                parts.append(window[:cut][loose[:cut]])
                kept.append(window[:cut][(live & ~loose)[:cut]])
                seg[1] = off + cut
                need = 0
        pinned = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
        if need:  # every unpinned free block is taken: soft pins by priority
            soft = pinned[level[pinned] == SOFT]
            chosen = soft[soft_order(self.pin_prio[soft])[:need]]
            if len(chosen) < need:
                raise SimulationError(
                    f"{n} blocks asked for but only {n - need + len(chosen)} are free and not "
                    "pinned by requirement (the caller's fit check was wrong)"
                )
            parts.append(chosen)
            pinned = pinned[~np.isin(pinned, chosen)]
            self._unfree_pins(chosen)
            level[chosen] = NONE
            self.pin_prio[chosen] = 0.0
        if len(pinned):
            sid = next(self._sid)
            where[pinned] = sid
            segs.appendleft([pinned, 0, sid])
            self._num_entries += len(pinned)
        got = np.concatenate(parts) if len(parts) != 1 else parts[0]
        self._num_free -= n
        where[got] = -1
        self.ref_cnt[got] = 1
        if self.on_evict is not None:
            self._emit_evictions(got)
        self._idx.evict(got)
        return got

    def _push_free(self, zero: np.ndarray) -> None:
        """Append unreferenced blocks to the free queue's tail, in order."""
        sid = next(self._sid)
        self._where[zero] = sid
        self._segs.append([zero, 0, sid])
        self._num_free += len(zero)
        self._num_entries += len(zero)
        if self._pins_used:
            lv = self.pin_level[zero]
            if np.count_nonzero(lv):
                self._num_pinned_free += int(np.count_nonzero(lv))
                self._num_hard_free += int(np.count_nonzero(lv == HARD))
        if self._num_entries > self.max_queue_entries:
            self._compact_queue()

    def _compact_queue(self) -> None:
        """Rewrite the queue as one segment of its live entries (touched blocks leave stale
        entries behind when the front rarely advances, e.g. a large, lightly used pool)."""
        live = np.array(self.free_queue, dtype=np.int64)
        sid = next(self._sid)
        self._where[live] = sid
        self._segs = deque([[live, 0, sid]])
        self._stale_sids = set()
        self._num_entries = len(live)

    # -- HEAR: pins ------------------------------------------------------------------------

    def _unfree_pins(self, blocks: np.ndarray) -> None:
        """Pinned blocks among `blocks` leave the free queue (touched or taken)."""
        lv = self.pin_level[blocks]
        self._num_pinned_free -= int(np.count_nonzero(lv))
        self._num_hard_free -= int(np.count_nonzero(lv == HARD))

    def set_pin(self, block: int, level: int, priority: float = 0.0) -> None:
        """Set one block's pin level (NONE / SOFT / HARD) and retention priority."""
        old = int(self.pin_level[block])
        if level != NONE:
            self._pins_used = True
        self.pin_level[block] = level
        self.pin_prio[block] = priority if level else 0.0
        if self.ref_cnt[block] == 0:  # free: on the queue
            self._num_pinned_free += (level != NONE) - (old != NONE)
            self._num_hard_free += (level == HARD) - (old == HARD)

    # -- checks ----------------------------------------------------------------------------

    def _check_pins(self, queue: np.ndarray) -> None:
        lv = self.pin_level
        on_queue = lv[queue]
        counts = (int(np.count_nonzero(on_queue)), int(np.count_nonzero(on_queue == HARD)))
        if counts != (self._num_pinned_free, self._num_hard_free):
            raise SimulationError(
                f"KV pin counts (free, hard free) {counts} disagree with the kept "
                f"{(self._num_pinned_free, self._num_hard_free)}"
            )
        if np.any(lv[~self._idx.hashed[: self.num_blocks]] != NONE):
            raise SimulationError("a KV block without a cached hash carries a pin")
