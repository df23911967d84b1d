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
A request's block table is an array too (`BlockTable`), so no list is built or converted on
allocation or free. Lookups ask the index only about blocks that may be cached: a prompt given
as prefix-block hashes derives each block hash from its prefix key, and the index keeps the keys
any cached hash derives from (`_num_maybe_cached`); a chunked prefill's later chunks reuse the
admission lookup while it is valid (`_lookups`, `any_cached` of a `BlockRange`).
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

HEAR hooks (`hear_side.py`), all inert until used, so the default path is vLLM's exactly:
- retention pins (`retention.py`): per-block pin levels; while any pinned block is free, taking
  free blocks follows the retention rule (`_pop_pinned`), and requirement-pinned free blocks do
  not count in `num_free_blocks` / `usage` (they cannot be allocated);
- the host tier (`host_tier.py`): `on_evict` receives the hashes the GPU evicts, a lookup extends
  the GPU prefix hit with the host tier's leading run, which the admission's allocation takes
  out of the host tier once it is sure to fit (a lookup that does not admit changes nothing, so
  stepping and fast-forward agree), `on_cache` sees every newly cached (block, hash), and
  `host_loads` collects each admission's loaded block count for the step's transfer time;
  `load_blocks` is a `CachePrepare`'s load onto free GPU blocks;
- `compress` shrinks a request's block table for the `kv_budget` mode (`modes.py`) and caps it.

Examples:
    >>> kv = KVCacheManager(num_blocks=4, block_size=16)
    >>> kv.usage
    0.0
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from maserve_prefect.engine.sim.block_table import BlockTable
from maserve_prefect.engine.sim.kv_index import HashIndex
from maserve_prefect.engine.sim.request import SimRequest
from maserve_prefect.engine.sim.retention import HARD, NONE, SOFT, soft_order
from maserve_prefect.errors import ConfigError, SimulationError

if TYPE_CHECKING:
    from maserve_prefect.engine.sim.host_tier import HostTier

_SMALL = 4  # at most this many blocks: plain Python beats numpy's per-call overhead
_NO_BLOCKS = np.zeros(0, dtype=np.int64)  # shared empty result (never written)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockRange(NamedTuple):
    """Blocks `start..end-1` of `req` (what `any_cached` asks about a request's prompt)."""

    req: SimRequest
    start: int
    end: int


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
        self.req_blocks: dict[int, BlockTable] = {}  # request seq -> block ids
        self.num_cached_blocks: dict[int, int] = {}  # request seq -> blocks hashed so far
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0
        self._lookup: tuple[SimRequest, np.ndarray] | None = None
        # request seq -> (epoch, its admission lookup), valid while `_epoch` is unchanged: the
        # count of hashing calls that cached shareable (cross-request) hashes
        self._lookups: dict[int, tuple[int, np.ndarray]] = {}
        self._epoch = 0
        self.max_queue_entries = 2 * num_blocks + 64  # then `_compact_queue`
        # HEAR hooks (module docstring); None / empty / zero while unused. Keep the instance
        # under 30 attributes: CPython shares (and fast-paths) instance dict keys up to 29.
        self.host: HostTier | None = None
        self.on_evict: Callable[[list[int]], None] | None = None
        self.on_cache: Callable[[np.ndarray, np.ndarray], None] | None = None
        self.host_loads: list[tuple[SimRequest, int]] = []
        self._host_pending: tuple[SimRequest, list[int]] | None = None
        self._caps: dict[int, int] = {}  # request seq -> most blocks it may hold (kv_budget)
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

    def blocks_of(self, req: SimRequest) -> list[int]:
        """`req`'s block ids in order (a new list)."""
        table = self.req_blocks.get(req.seq)
        return [] if table is None else table.tolist()

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

    def cached_mask(self, hashes: np.ndarray) -> np.ndarray:
        """Whether each hash (a uint64 array) is cached here (a bool array): a query over the
        hashes asked about, not a copy of the whole table."""
        return self._idx.find(hashes) >= 0

    # -- lookup ----------------------------------------------------------------------------

    def get_computed_blocks(self, req: SimRequest) -> tuple[list[int], int]:
        """Longest cached prefix of `req`'s full blocks, capped at `num_tokens - 1` tokens."""
        hits, num_hit_tokens = self.lookup_prefix(req)
        return hits.tolist(), num_hit_tokens

    def lookup_prefix(self, req: SimRequest) -> tuple[np.ndarray, int]:
        """`get_computed_blocks` with the hit blocks as an int64 array (the scheduler's form:
        `ensure_slots` takes it as is)."""
        if not self.enable_prefix_caching:
            return _NO_BLOCKS, 0
        max_blocks = (req.num_tokens - 1) // self.block_size
        if max_blocks <= 0:
            return _NO_BLOCKS, 0
        hashes = req.block_hash_array(max_blocks)[:max_blocks]
        if max_blocks <= _SMALL:
            found_small: list[int] = []
            for h in hashes.tolist():
                b = self._idx.find_one(h)
                if b < 0:
                    break
                found_small.append(b)
            hits = np.array(found_small, dtype=np.int64)
        else:
            found = self._find(req, hashes, 0, max_blocks)
            self._lookup = (req, found)  # the admission's hashing reuses it (`_cache_full_blocks`)
            misses = np.flatnonzero(found < 0)
            hits = found[: int(misses[0]) if len(misses) else max_blocks]
        if self.host is not None and len(hits) < max_blocks:
            return hits, (len(hits) + self._host_run(req, hashes, len(hits))) * self.block_size
        return hits, len(hits) * self.block_size

    def _host_run(self, req: SimRequest, hashes: np.ndarray, start: int) -> int:
        """Blocks after the GPU hit that the host tier holds (a leading run); the admission's
        allocation loads them (`ensure_slots`)."""
        host = self.host
        assert host is not None
        if not len(host):
            return 0
        rest = hashes[start:].tolist()
        run = host.prefix_run(rest)
        if run:
            self._host_pending = (req, rest[:run])
        return run

    def any_cached(self, hashes: np.ndarray | BlockRange) -> bool:
        """Whether some block caches one of `hashes` (a uint64 array, or a request's block
        range), or the host tier holds one (caching it on the GPU then changes the host tier
        too).

        A `BlockRange` is answered from its request's kept admission lookup while that is
        valid (see `_cache_full_blocks`), else by looking up only the blocks that may be
        cached (`_num_maybe_cached`): a chunked prefill does not look its prompt up twice.
        """
        if isinstance(hashes, BlockRange):
            req, start, end = hashes
            hashes = req.block_hash_array(end)[start:end]
            was = self._kept_lookup(req, end)
            if was is None:
                cached = self._find(req, hashes, start, end) >= 0
            else:
                cached = self._idx.still_cached(was[start:end], hashes)
        else:
            cached = self._idx.find(hashes) >= 0
        if np.count_nonzero(cached):
            return True
        host = self.host
        return host is not None and len(host) > 0 and host.any_of(hashes.tolist())

    def _find(self, req: SimRequest, hashes: np.ndarray, start: int, end: int) -> np.ndarray:
        """`HashIndex.find` of `req`'s block hashes `start..end-1` (`hashes`), asking the index
        only about the blocks that may be cached (`_num_maybe_cached`)."""
        n = self._num_maybe_cached(req, end) - start
        if n >= len(hashes):
            return self._idx.find(hashes)
        found = np.full(len(hashes), -1, dtype=np.intp)
        if n > 0:
            found[:n] = self._idx.find(hashes[:n])
        return found

    def _num_maybe_cached(self, req: SimRequest, end: int) -> int:
        """Of `req`'s blocks `0..end-1`, how many leading ones may be cached (none after them is).

        For a prompt given as prefix-block hashes, block j's hash derives from the prefix key
        of its last prefix block (`SimRequest.prefix_keys`, one per chain value), so a key no
        cached hash derives from (`HashIndex.chains`) rules out every block that derives from
        it. The registered keys are prefix-closed (a request registers its keys from where its
        cached prefix ends, and that prefix was registered by whoever cached it), so the first
        unregistered one bounds the rest. Blocks past the shareable prefix hold hashes unique to
        `req`: cached nowhere unless `req` cached them before a preemption. (Exact up to 64-bit
        hash collisions, which prefix caching assumes away anyway.)
        """
        chains = self._idx.chains
        if chains is None or req.num_preemptions or not req.has_prefix_chain:
            return end
        p = 0
        for c in req.prefix_keys().tolist():
            if c not in chains:
                break
            p += 1
        return min(end, req.num_blocks_within(p), req.num_shareable_blocks)

    def _kept_lookup(self, req: SimRequest, end: int) -> np.ndarray | None:
        """`req`'s kept lookup (block per hash at its admission) if still valid and covering
        blocks `0..end-1`."""
        kept = self._lookups.get(req.seq)
        if kept is None or kept[0] != self._epoch or len(kept[1]) < end:
            return None
        return kept[1]

    def record_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count an admitted request's prefix lookup (queries and hits, in tokens). Host-tier
        hits count in `host.num_hit_tokens`: the admission's load took them off the GPU hits
        in advance (`_commit_host_load`)."""
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
        `num_computed_tokens` defaults to the request's own count. Returns the new blocks.
        """
        new = self.allocate(req, num_new_tokens, computed_blocks, num_computed_tokens)
        return None if new is None else new.tolist()

    def allocate(
        self,
        req: SimRequest,
        num_new_tokens: int,
        computed_blocks: Sequence[int] | np.ndarray = (),
        num_computed_tokens: int | None = None,
    ) -> np.ndarray | None:
        """`allocate_slots` with the new blocks as an int64 array (the scheduler's form)."""
        computed = req.num_computed_tokens if num_computed_tokens is None else num_computed_tokens
        return self.ensure(req, computed + num_new_tokens, computed_blocks)

    def ensure_slots(
        self,
        req: SimRequest,
        num_total_tokens: int,
        computed_blocks: Sequence[int] = (),
        uncached: bool = False,
    ) -> list[int] | None:
        """Make `req` hold blocks for `num_total_tokens` tokens and hash the ones they fill.

        `uncached`: the caller checked that none of the hashes this call caches is cached
        anywhere (`any_cached`), so the duplicate check is skipped. Returns the new blocks, or
        None when they do not fit (then nothing changed).
        """
        new = self.ensure(req, num_total_tokens, computed_blocks, uncached)
        return None if new is None else new.tolist()

    def ensure(
        self,
        req: SimRequest,
        num_total_tokens: int,
        computed_blocks: Sequence[int] | np.ndarray = (),
        uncached: bool = False,
    ) -> np.ndarray | None:
        """`ensure_slots` with the new blocks as an int64 array (no list is built)."""
        lookup, self._lookup = self._lookup, None
        blocks = self.req_blocks.get(req.seq)
        num_computed = len(computed_blocks)
        if (
            blocks is not None
            and not num_computed
            and num_total_tokens <= len(blocks) * self.block_size
            and (
                not self.enable_prefix_caching
                or num_total_tokens // self.block_size <= self.num_cached_blocks.get(req.seq, 0)
            )
        ):
            return _NO_BLOCKS  # most decode steps: no block to take, none newly full
        if blocks is None:
            blocks = self.req_blocks[req.seq] = BlockTable(
                -(-(req.num_prompt_tokens + req.max_tokens) // self.block_size)
            )

        num_new = -(-num_total_tokens // self.block_size) - len(blocks) - num_computed
        pending = None
        if num_new <= 0:  # most decode steps: nothing to take, nothing to check
            num_new = 0
        else:
            if self._caps and req.seq in self._caps:  # kv_budget: no block past its budget
                num_new = max(0, min(num_new, self._caps[req.seq] - len(blocks)))
            pending = self._host_pending  # an admission's host-tier run
        hits = None
        num_evictable = 0
        if num_computed:
            hits = np.asarray(computed_blocks, dtype=np.intp)
            hit_refs = self.ref_cnt.take(hits)
            free_hits = hits[hit_refs == 0]
            num_evictable = len(free_hits)
        need = num_new + num_evictable
        # hard-pinned free blocks cannot be taken (only hit): they are not in the room
        if (
            need
            and need > self._num_free - self._num_hard_free
            and not (self._num_hard_free and self._fits_hard_hits(hits, need))
        ):
            if not blocks:
                del self.req_blocks[req.seq]
            self._host_pending = None  # not admitted: the host tier stays as it was
            return None
        if pending is not None:  # out of the host tier before evictions land there
            assert self.host is not None and pending[0] is req
            self.host.take(pending[1])
        admission = num_computed > 0 and not blocks
        if hits is not None:  # touch: a free cached block leaves the LRU queue
            if self._num_pinned_free:
                self._unfree_pins(free_hits)
            if num_evictable:
                self._stale_sids.update(self._where.take(free_hits).tolist())
            self._where[free_hits] = -1
            self._num_free -= num_evictable
            hit_refs += 1
            self.ref_cnt[hits] = hit_refs
            blocks.extend(hits)

        if num_new > _SMALL:
            new_arr = self._pop_free_array(num_new)
        elif num_new:
            new_arr = np.array(self._pop_free(num_new), dtype=np.int64)
        else:
            new_arr = _NO_BLOCKS
        if num_new:
            blocks.extend(new_arr)
        if self.enable_prefix_caching:
            if admission:  # prefix hits are cached already, hashing resumes after them
                self.num_cached_blocks[req.seq] = num_computed
            if lookup is not None and (
                lookup[0] is not req or len(blocks) > num_new + num_computed
            ):
                lookup = None  # not this request's admission
            self._cache_full_blocks(req, blocks.view(), num_total_tokens, lookup, uncached)
        if pending is not None:
            self._commit_host_load(req)
        return new_arr

    def _fits_hard_hits(self, hits: np.ndarray | None, need: int) -> bool:
        """Whether `need` blocks (hits leaving the free queue included) fit once the hits on
        hard-pinned free blocks count as room: touching them takes nothing allocatable."""
        if hits is None:
            return False
        hard_hits = (self.ref_cnt[hits] == 0) & (self.pin_level[hits] == HARD)
        return need <= self._num_free - self._num_hard_free + int(np.count_nonzero(hard_hits))

    def _commit_host_load(self, req: SimRequest) -> None:
        """The admission that looked up host-tier blocks allocated: they are loaded."""
        assert self._host_pending is not None and self._host_pending[0] is req
        taken = self._host_pending[1]
        self._host_pending = None
        tokens = len(taken) * self.block_size
        assert self.host is not None
        self.host.num_hit_tokens += tokens
        self.num_hit_tokens -= tokens  # `record_lookup` adds the whole hit next
        if req.num_cached_tokens < 0:  # first admission: the request's own count
            req.num_cached_cpu_tokens = tokens
        self.host_loads.append((req, len(taken)))

    def append_blocks(self, owners: Sequence[SimRequest]) -> None:
        """Pop one free block per entry of `owners`, in order, onto that request's table.

        A decode run's block crossings in stepping order (fast-forward); no hashing happens.

        Raises:
            SimulationError: fewer free blocks than owners.
        """
        if len(owners) > self.num_free_blocks:
            raise SimulationError(f"{len(owners)} blocks asked for, {self.num_free_blocks} free")
        req_blocks = self.req_blocks
        for req, b in zip(owners, self._pop_free(len(owners)), strict=True):
            req_blocks[req.seq].append(b)

    def hash_full_blocks(self, req: SimRequest, num_tokens: int) -> None:
        """Cache the blocks of `req` that `num_tokens` tokens fill (prefix caching on)."""
        if self.enable_prefix_caching:
            self._cache_full_blocks(req, self.req_blocks[req.seq].view(), num_tokens)

    def _pop_free(self, n: int) -> list[int]:
        """Take the `n` least recently freed blocks, evicting their hashes (they get new tokens)."""
        if n > _SMALL:
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
        """`_pop_free` for n > `_SMALL`, as an int64 array."""
        if self._num_pinned_free:
            return self._pop_pinned(n)
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
            live = window[where.take(window) == sid] if sid in self._stale_sids else window
            parts.append(live)
            need -= len(live)
        got: np.ndarray = parts[0] if len(parts) == 1 else np.concatenate(parts)
        where[got] = -1
        self.ref_cnt[got] = 1
        if self.on_evict is not None:
            self._emit_evictions(got)
        self._idx.evict(got)  # its hash is no longer cached
        return got

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

    def _cache_full_blocks(
        self,
        req: SimRequest,
        blocks: np.ndarray,
        num_tokens: int,
        lookup: tuple[SimRequest, np.ndarray] | None = None,
        uncached: bool = False,
    ) -> None:
        """Hash the blocks `num_tokens` tokens fill; a duplicate of a cached block stays unhashed.

        `blocks` is `req`'s block table (`BlockTable.view()`). Which of the new hashes are cached elsewhere already (duplicates) is asked of the index
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
            if req.has_prefix_chain and idx.chains is not None:
                p0, p1 = req.prefix_positions(start, min(num_full, n_shared))
                idx.chains.update(req.prefix_keys()[p0:p1].tolist())
        if num_full - start <= _SMALL:
            for b, h in zip(blocks[start:num_full].tolist(), sh.tolist(), strict=True):
                # a hit block is hashed already; a duplicate stays uncached (vLLM keeps one)
                if not idx.hashed[b] and idx.find_one(h) < 0:
                    idx.add_one(b, h)
                    if self.on_cache is not None:
                        self.on_cache(np.array([b]), np.array([h], dtype=np.uint64))
        else:
            sb = blocks[start:num_full]
            skip = idx.hashed.take(sb)  # a hit block is hashed already
            n_check = 0 if uncached else check_end - start
            if n_check:
                if lookup is not None and len(lookup[1]) >= check_end:
                    was = lookup[1][start:check_end]
                elif kept is not None and len(kept[1]) >= check_end:
                    was = kept[1][start:check_end]
                else:
                    was = None
                sc = sh[:n_check]
                if was is not None:
                    dup = idx.still_cached(was, sc)
                else:
                    dup = self._find(req, sc, start, check_end) >= 0
                skip[:n_check] |= dup  # a duplicate stays uncached (vLLM keeps one)
            if np.count_nonzero(skip):
                keep = ~skip
                sb, sh = sb[keep], sh[keep]
            idx.add(sb, sh)
            if self.on_cache is not None and len(sb):
                self.on_cache(sb, sh)
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
        if self._caps:
            self._caps.pop(req.seq, None)
        if not blocks:
            return
        arr = blocks.view()[::-1]  # the table is dropped: its buffer can back a queue segment
        left = self.ref_cnt.take(arr)
        left -= 1
        self.ref_cnt[arr] = left
        zero = arr if not np.count_nonzero(left) else arr[left == 0]
        if len(zero):
            self._push_free(zero)

    def _push_free(self, zero: np.ndarray) -> None:
        """Append unreferenced blocks to the free queue's tail, in order."""
        sid = next(self._sid)
        self._where[zero] = sid
        self._segs.append([zero, 0, sid])
        self._num_free += len(zero)
        self._num_entries += len(zero)
        lv = self.pin_level[zero]  # per freed batch, not per step: cheap enough to always do
        if np.count_nonzero(lv):
            self._num_pinned_free += int(np.count_nonzero(lv))
            self._num_hard_free += int(np.count_nonzero(lv == HARD))
        if self._num_entries > self.max_queue_entries:
            self._compact_queue()

    # -- HEAR: pins, prepared loads, compression -------------------------------------------

    def _unfree_pins(self, blocks: np.ndarray) -> None:
        """Pinned blocks among `blocks` leave the free queue (touched or taken)."""
        lv = self.pin_level[blocks]
        self._num_pinned_free -= int(np.count_nonzero(lv))
        self._num_hard_free -= int(np.count_nonzero(lv == HARD))

    def set_pin(self, block: int, level: int, priority: float = 0.0) -> None:
        """Set one block's pin level (NONE / SOFT / HARD) and retention priority."""
        old = int(self.pin_level[block])
        self.pin_level[block] = level
        self.pin_prio[block] = priority if level else 0.0
        if self.ref_cnt[block] == 0:  # free: on the queue
            self._num_pinned_free += (level != NONE) - (old != NONE)
            self._num_hard_free += (level == HARD) - (old == HARD)

    def block_of(self, block_hash: int) -> int:
        """The GPU block caching `block_hash`, or -1."""
        return self._idx.find_one(block_hash)

    def load_blocks(self, hashes: Sequence[int]) -> list[int]:
        """Cache `hashes` (distinct, cached on no GPU block) in free blocks, as many as fit:
        a `CachePrepare` load. The blocks join the free queue's tail (most recently used);
        taking them evicts LRU blocks as any allocation does. Returns the blocks used."""
        n = min(len(hashes), self.num_free_blocks)
        if n <= 0:
            return []
        got = np.asarray(self._pop_free(n), dtype=np.int64)
        hv = np.array(hashes[:n], dtype=np.uint64)
        self._idx.add(got, hv)
        self._idx.chains = None  # hashes of unknown origin: every lookup asks the index
        self._epoch += 1  # cached hashes changed: kept lookups are stale
        self._lookup = None
        if self.on_cache is not None:
            self.on_cache(got, hv)
        self.ref_cnt[got] = 0
        self._push_free(got)
        return got.tolist()

    def compress(self, req: SimRequest, keep_blocks: int) -> int:
        """Hold `req` to at most `keep_blocks` blocks from now on (`kv_budget` mode): its blocks
        past the first `keep_blocks` are freed (hashed ones stay cached), no further block of
        it is hashed. Returns the blocks freed."""
        blocks = self.req_blocks.get(req.seq)
        self._caps[req.seq] = keep_blocks
        self.num_cached_blocks[req.seq] = 1 << 62  # its later blocks hold compressed KV
        self._lookups.pop(req.seq, None)
        if not blocks or len(blocks) <= keep_blocks:
            return 0
        tail = blocks.truncate(keep_blocks)
        arr = tail[::-1]
        self.ref_cnt[arr] -= 1
        zero = arr[self.ref_cnt[arr] == 0]
        if len(zero):
            self._push_free(zero)
        return len(tail)

    def is_compressed(self, req: SimRequest) -> bool:
        return req.seq in self._caps

    def _compact_queue(self) -> None:
        """Rewrite the queue as one segment of its live entries (touched blocks leave stale
        entries behind when the front rarely advances, e.g. a large, lightly used pool)."""
        live = np.array(self.free_queue, dtype=np.int64)
        sid = next(self._sid)
        self._where[live] = sid
        self._segs = deque([[live, 0, sid]])
        self._stale_sids = set()
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
        self.pin_level[:] = NONE
        self.pin_prio[:] = 0.0
        self._num_pinned_free = self._num_hard_free = 0
        self._host_pending = None
        self._reset_queue()

    # -- checks ----------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Blocks conserved, ref counts match the block tables, the cache index is consistent."""
        expected = np.zeros(self.num_blocks, dtype=np.int64)
        for blocks in self.req_blocks.values():
            np.add.at(expected, blocks.view(), 1)

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
        self._check_pins(np.asarray(queue, dtype=np.int64))

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
