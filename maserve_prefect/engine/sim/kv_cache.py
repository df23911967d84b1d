"""Paged KV cache with prefix caching, following vLLM v1's `BlockPool` + `KVCacheManager`.

Blocks carry a reference count and, once full, a chained hash (see `request.py`). Free blocks sit
in an LRU queue: allocation pops the front and evicts that block's hash if it had one; a prefix
hit on a free cached block "touches" it (takes it out of the queue). A finished or preempted
request frees its blocks in *reverse* order, so its tail blocks are evicted first and its hashed
blocks stay reusable until evicted. A lookup hits at most `num_tokens - 1` tokens, so at least one
token is always computed. "Doesn't fit" is a value: `allocate_slots` returns None and the
scheduler decides whom to preempt.

The speed idea: the queue holds whole *segments* (one numpy array of block ids per `free` call)
instead of single blocks, so freeing a request or allocating a long prompt costs a few numpy
calls, not a dict operation per block. A touched block is removed lazily: `_where[b]` names the
segment it sits in (-1 when it is not free) and a segment entry counts only while it matches.
Hashes live in a `HashIndex` (`kv_index.py`): numpy arrays per block plus a direct-mapped table,
so hashing or looking up a prompt's blocks is vectorized too, and eviction is one array write.
The observable behaviour (which block is taken next, which hash is evicted, which duplicate stays
uncached) is exactly the per-block LRU's; `tests/engine/kv_reference.py` keeps that per-block
version and a differential property test holds the two together. `free_queue`, `cached` and
`block_hash` give the canonical view (built on demand, for tests and checks).

Counters follow vLLM's Prometheus `vllm:prefix_cache_queries_total` (tokens looked up) and
`vllm:prefix_cache_hits_total` (tokens hit), counted once per admission (re-admissions after
preemption included) via `record_lookup`. vLLM also counts the lookup of a queue head that then
fails to allocate, at every step it stays blocked, which ties its counter to the number of steps;
ours counts the lookup that admitted the request, so fast-forwarded and stepped runs agree.
`usage = 1 - free / num_blocks` (`vllm:kv_cache_usage_perc`).

Examples:
    >>> kv = KVCacheManager(num_blocks=4, block_size=16)
    >>> kv.usage
    0.0
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence

import numpy as np

from maserve_prefect.engine.sim.kv_index import HashIndex
from maserve_prefect.engine.sim.request import SimRequest
from maserve_prefect.errors import ConfigError, SimulationError

_SMALL = 4  # at most this many blocks: plain Python beats numpy's per-call overhead


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Block pool and per-request block tables for one replica.

    Args:
        num_blocks: KV capacity in blocks (> 0).
        block_size: tokens per block (> 0).
        enable_prefix_caching: when off, nothing is hashed and lookups always miss.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ConfigError(
                f"KV cache needs num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_cnt = np.zeros(num_blocks, dtype=np.int64)
        self._idx = HashIndex(num_blocks)  # hash <-> block of the cached blocks
        self.req_blocks: dict[int, list[int]] = {}  # request seq -> block ids
        self.num_cached_blocks: dict[int, int] = {}  # request seq -> blocks hashed so far
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0
        self._lookup: tuple[SimRequest, np.ndarray] | None = None
        # request seq -> (epoch, its admission lookup), valid while `_epoch` is unchanged: the
        # count of hashing calls that cached shareable (cross-request) hashes
        self._lookups: dict[int, tuple[int, np.ndarray]] = {}
        self._epoch = 0
        self.max_queue_entries = 2 * num_blocks + 64  # then `_compact_queue`
        self._reset_queue()

    def _reset_queue(self) -> None:
        self._sid = itertools.count(1)
        # each segment: [block ids in queue order, offset of the first unread entry, segment id]
        self._segs: deque[list] = deque([[np.arange(self.num_blocks, dtype=np.int64), 0, 0]])
        self._where = np.zeros(self.num_blocks, dtype=np.int64)  # segment id, -1 = not free
        self._num_free = self.num_blocks
        # entries in the segments, stale ones (touched blocks) included; bounded by compaction
        self._num_entries = self.num_blocks

    # -- views -----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return self._num_free

    @property
    def usage(self) -> float:
        return 1.0 - self._num_free / self.num_blocks

    def blocks_of(self, req: SimRequest) -> list[int]:
        return self.req_blocks.get(req.seq, [])

    @property
    def free_queue(self) -> list[int]:
        """Free block ids, least recently freed first (the eviction order)."""
        out: list[int] = []
        where = self._where
        for arr, off, sid in self._segs:
            rest = arr[off:]
            out.extend(rest[where[rest] == sid].tolist())
        return out

    @property
    def block_hash(self) -> dict[int, int]:
        """Block id -> hash, for the blocks whose hash is cached."""
        return self._idx.block_hash()

    @property
    def cached(self) -> dict[int, int]:
        """Hash -> block id of every cached (hit-able) block."""
        return {h: b for b, h in self._idx.block_hash().items()}

    # -- lookup ----------------------------------------------------------------------------

    def get_computed_blocks(self, req: SimRequest) -> tuple[list[int], int]:
        """Longest cached prefix of `req`'s full blocks, capped at `num_tokens - 1` tokens."""
        if not self.enable_prefix_caching:
            return [], 0
        max_blocks = (req.num_tokens - 1) // self.block_size
        if max_blocks <= 0:
            return [], 0
        hashes = req.block_hash_array(max_blocks)[:max_blocks]
        if max_blocks <= _SMALL:
            hits: list[int] = []
            for h in hashes.tolist():
                b = self._idx.find_one(h)
                if b < 0:
                    break
                hits.append(b)
            return hits, len(hits) * self.block_size
        found = self._idx.find(hashes)
        self._lookup = (req, found)  # the admission's hashing reuses it (see `_cache_many`)
        misses = np.flatnonzero(found < 0)
        num_hits = int(misses[0]) if len(misses) else max_blocks
        return found[:num_hits].tolist(), num_hits * self.block_size

    def any_cached(self, hashes: np.ndarray) -> bool:
        """Whether some block caches one of `hashes` (uint64 array)."""
        return bool((self._idx.find(hashes) >= 0).any())

    def record_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count an admitted request's prefix lookup (queries and hits, in tokens)."""
        self.num_queried_tokens += num_tokens
        self.num_hit_tokens += num_hit_tokens

    # -- allocation ------------------------------------------------------------------------

    def allocate_slots(
        self,
        req: SimRequest,
        num_new_tokens: int,
        computed_blocks: Sequence[int] = (),
        num_computed_tokens: int | None = None,
    ) -> list[int] | None:
        """Give `req` room for `num_new_tokens` more tokens; None if they do not fit.

        `computed_blocks` (from `get_computed_blocks`) are prefix hits being taken on admission;
        `num_computed_tokens` defaults to the request's own count.
        """
        computed = req.num_computed_tokens if num_computed_tokens is None else num_computed_tokens
        total = computed + num_new_tokens
        return self.ensure_slots(req, total, computed_blocks)

    def ensure_slots(
        self,
        req: SimRequest,
        num_total_tokens: int,
        computed_blocks: Sequence[int] = (),
        uncached: bool = False,
    ) -> list[int] | None:
        """Make `req` hold blocks for `num_total_tokens` tokens and hash the ones they fill.

        `uncached`: the caller checked that none of the hashes this call caches is cached
        anywhere (`any_cached`), so the duplicate check is skipped.
        """
        lookup, self._lookup = self._lookup, None
        blocks = self.req_blocks.get(req.seq)
        if blocks is None:
            blocks = self.req_blocks[req.seq] = []
        num_new = -(-num_total_tokens // self.block_size) - len(blocks) - len(computed_blocks)
        if num_new < 0:
            num_new = 0
        hits = None
        num_evictable = 0
        if computed_blocks:
            hits = np.asarray(computed_blocks, dtype=np.int64)
            num_evictable = int(np.count_nonzero(self.ref_cnt[hits] == 0))
        if num_new + num_evictable > self._num_free:
            if not blocks:
                del self.req_blocks[req.seq]
            return None
        if hits is not None:  # touch: a free cached block leaves the LRU queue
            self._where[hits[self.ref_cnt[hits] == 0]] = -1
            self._num_free -= num_evictable
            self.ref_cnt[hits] += 1
            blocks.extend(computed_blocks)
        new_arr = None
        if num_new > _SMALL:
            new_arr = self._pop_free_array(num_new)
            new_blocks = new_arr.tolist()
        else:
            new_blocks = self._pop_free(num_new) if num_new else []
        blocks.extend(new_blocks)
        if self.enable_prefix_caching:
            if computed_blocks and len(blocks) == len(new_blocks) + len(computed_blocks):
                # admission: prefix hits are cached already, hashing resumes after them
                self.num_cached_blocks[req.seq] = len(computed_blocks)
            if lookup is not None and (
                lookup[0] is not req or len(blocks) > len(new_blocks) + len(computed_blocks)
            ):
                lookup = None  # not this request's admission
            self._cache_full_blocks(req, blocks, num_total_tokens, lookup, new_arr, uncached)
        return new_blocks

    def append_blocks(self, owners: Sequence[SimRequest]) -> None:
        """Pop one free block per entry of `owners`, in order, onto that request's table.

        A decode run's block crossings in stepping order (fast-forward); no hashing happens.

        Raises:
            SimulationError: fewer free blocks than owners.
        """
        if len(owners) > self._num_free:
            raise SimulationError(f"{len(owners)} blocks asked for, {self._num_free} free")
        req_blocks = self.req_blocks
        for req, b in zip(owners, self._pop_free(len(owners)), strict=True):
            req_blocks[req.seq].append(b)

    def hash_full_blocks(self, req: SimRequest, num_tokens: int) -> None:
        """Cache the blocks of `req` that `num_tokens` tokens fill (prefix caching on)."""
        if self.enable_prefix_caching:
            self._cache_full_blocks(req, self.req_blocks[req.seq], num_tokens)

    def _pop_free(self, n: int) -> list[int]:
        """Take the `n` least recently freed blocks, evicting their hashes (they get new tokens)."""
        if n > _SMALL:
            return self._pop_free_array(n).tolist()
        self._num_free -= n
        segs, where = self._segs, self._where
        taken: list[int] = []
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
                self._idx.hashed[b] = False
        return taken

    def _pop_free_array(self, n: int) -> np.ndarray:
        """`_pop_free` for n > `_SMALL`, as an int64 array."""
        self._num_free -= n
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
            live = window[where[window] == sid]
            parts.append(live)
            need -= len(live)
        got: np.ndarray = parts[0] if len(parts) == 1 else np.concatenate(parts)
        where[got] = -1
        self.ref_cnt[got] = 1
        self._idx.evict(got)  # its hash is no longer cached
        return got

    def _cache_full_blocks(
        self,
        req: SimRequest,
        blocks: list[int],
        num_tokens: int,
        lookup: tuple[SimRequest, np.ndarray] | None = None,
        new_arr: np.ndarray | None = None,
        uncached: bool = False,
    ) -> None:
        """Hash the blocks `num_tokens` tokens fill; a duplicate of a cached block stays unhashed.

        `new_arr` is the array of the blocks just appended to the end of `blocks` (saves
        rebuilding it from the list).

        Which of the new hashes are cached elsewhere already (duplicates) is asked of the index
        only where the answer can be yes and is not known:
        - a block past the shareable prefix has a hash unique to `req` (`request.py`): cached
          nowhere unless `req` cached it before a preemption, so it is not looked up then;
        - `lookup` (the admission's prefix lookup of `req`, or the one kept in `_lookups` while
          no other request has cached a shareable hash since, `_epoch`) says which block cached
          each hash then. Since then blocks were only touched, taken (taking unhashes them) or
          given `req`'s own other hashes, so a hash is still cached exactly where that block
          still holds it.
        """
        start = self.num_cached_blocks.get(req.seq, 0)
        num_full = min(num_tokens // self.block_size, len(blocks))
        if num_full <= start:
            return
        self.num_cached_blocks[req.seq] = num_full
        sh = req.block_hash_array(num_full)[start:num_full]
        idx = self._idx
        n_shared = req.num_shareable_blocks
        # hashes [start, check_end) may be cached elsewhere; later ones are unique to `req`
        check_end = num_full if req.num_preemptions else max(min(num_full, n_shared), start)
        kept = self._lookups.get(req.seq)
        if kept is not None and kept[0] != self._epoch:
            kept = None
        if start < n_shared:  # shareable hashes get cached: other requests' lookups go stale
            self._epoch += 1
        if num_full - start <= _SMALL:
            for b, h in zip(blocks[start:num_full], sh.tolist(), strict=True):
                # a hit block is hashed already; a duplicate stays uncached (vLLM keeps one)
                if not idx.hashed[b] and idx.find_one(h) < 0:
                    idx.add_one(b, h)
        else:
            tail = len(blocks) - (0 if new_arr is None else len(new_arr))
            if new_arr is not None and start >= tail:
                sb = new_arr[start - tail : num_full - tail]
            elif new_arr is not None and start == tail - 1:  # the partly filled block first
                sb = np.concatenate(
                    (np.array(blocks[start : start + 1]), new_arr[: num_full - tail])
                )
            else:
                sb = np.array(blocks[start:num_full], dtype=np.int64)
            ok = ~idx.hashed[sb]
            n_check = 0 if uncached else check_end - start
            if n_check:
                if lookup is not None and len(lookup[1]) >= check_end:
                    was = lookup[1][start:check_end]
                elif kept is not None and len(kept[1]) >= check_end:
                    was = kept[1][start:check_end]
                else:
                    was = None
                sc = sh[:n_check]
                if was is not None:  # -1 indexes the never-hashed sentinel block
                    cached = idx.hashed[was] & (idx.hash_val[was] == sc)
                else:
                    cached = idx.find(sc) >= 0
                ok[:n_check] &= ~cached
            if not ok.all():
                sb, sh = sb[ok], sh[ok]
            idx.add(sb, sh)
        if lookup is not None:
            self._lookups[req.seq] = (self._epoch, lookup[1])
        elif kept is not None:
            self._lookups[req.seq] = (self._epoch, kept[1])

    def free(self, req: SimRequest) -> None:
        """Release `req`'s blocks, tail first onto the free queue; hashed blocks stay cached."""
        self._lookup = None
        self._lookups.pop(req.seq, None)
        blocks = self.req_blocks.pop(req.seq, None)
        self.num_cached_blocks.pop(req.seq, None)
        if not blocks:
            return
        arr = np.array(blocks[::-1], dtype=np.int64)
        ref = self.ref_cnt
        ref[arr] -= 1
        zero = arr[ref[arr] == 0]
        if len(zero):
            sid = next(self._sid)
            self._where[zero] = sid
            self._segs.append([zero, 0, sid])
            self._num_free += len(zero)
            self._num_entries += len(zero)
            if self._num_entries > self.max_queue_entries:
                self._compact_queue()

    def _compact_queue(self) -> None:
        """Rewrite the queue as one segment of its live entries (touched blocks leave stale
        entries behind when the front rarely advances, e.g. a large, lightly used pool)."""
        live = np.array(self.free_queue, dtype=np.int64)
        sid = next(self._sid)
        self._where[live] = sid
        self._segs = deque([[live, 0, sid]])
        self._num_entries = len(live)

    def reset_prefix_cache(self) -> None:
        """Drop every cached hash and restore the initial free order (vLLM `reset_prefix_cache`).

        Only valid when no request holds blocks (sleep discards the KV cache). Counters stay:
        they are Prometheus totals over the replica's life.

        Raises:
            SimulationError: some request still holds blocks.
        """
        if self.req_blocks:
            raise SimulationError(
                f"reset_prefix_cache with {len(self.req_blocks)} requests holding blocks; "
                "free them (finish or abort) first"
            )
        self._idx.reset()
        self._reset_queue()

    # -- checks ----------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Blocks conserved, ref counts match the block tables, the cache index is consistent."""
        expected = np.zeros(self.num_blocks, dtype=np.int64)
        for blocks in self.req_blocks.values():
            np.add.at(expected, np.asarray(blocks, dtype=np.int64), 1)
        if not np.array_equal(expected, self.ref_cnt):
            raise SimulationError("KV ref counts disagree with the request block tables")
        queue = self.free_queue
        num_referenced = int(np.count_nonzero(self.ref_cnt))
        if len(set(queue)) != len(queue) or len(queue) != self._num_free:
            raise SimulationError("the KV free queue holds a block twice or miscounts")
        if num_referenced + len(queue) != self.num_blocks:
            raise SimulationError(
                f"KV blocks not conserved: {num_referenced} referenced + "
                f"{len(queue)} free != {self.num_blocks}"
            )
        if np.any(self.ref_cnt[np.asarray(queue, dtype=np.int64)] != 0):
            raise SimulationError("a block on the free queue is still referenced")
        for h, b in self.cached.items():
            if self._idx.find_one(h) != b:
                raise SimulationError(f"cache index points block {b} at a stale hash")
