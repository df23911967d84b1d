"""Paged KV cache with prefix caching, following vLLM v1's `KVCacheManager`: per-request block
tables over a prefix cache over a block pool.

Three layers, one concept each: `BlockPool` (`kv/block_pool.py`) holds reference counts, the LRU
free queue and retention pins; `PrefixCache` (`kv/prefix_cache.py`) hashes full blocks and looks
prompts up; `KVCacheManager` (here) gives each request its block table and allocates for it.
A finished or preempted request frees its blocks in *reverse* order, so its tail blocks are
evicted first and its hashed blocks stay reusable until evicted. "Doesn't fit" is a value:
`allocate_slots` returns None and the scheduler decides whom to preempt. A request's block table
is an array (`BlockTable`), so no list is built or converted on allocation or free.
`usage = 1 - free / num_blocks` (`vllm:kv_cache_usage_perc`).

HEAR hooks (`hear/side.py`), all inert until used, so the default path is vLLM's exactly:
- retention pins (`retention.py`, kept by `BlockPool`): per-block pin levels; while any pinned
  block is free, taking free blocks follows the retention rule (`_pop_pinned`), and
  requirement-pinned free blocks do not count in `num_free_blocks` / `usage` (they cannot be
  allocated);
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

from collections.abc import Sequence

import numpy as np

from maserve_prefect.engines.sim.kv.block_pool import MAX_SCALAR_BLOCKS, NO_BLOCKS
from maserve_prefect.engines.sim.kv.block_table import BlockTable
from maserve_prefect.engines.sim.kv.prefix_cache import PrefixCache
from maserve_prefect.engines.sim.kv.retention import HARD, NONE
from maserve_prefect.engines.sim.request import SimRequest
from maserve_prefect.errors import SimulationError


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager(PrefixCache):
    """Block pool and per-request block tables for one replica.

    Args:
        num_blocks: KV capacity in blocks (> 0).
        block_size: tokens per block (> 0).
        enable_prefix_caching: when off, nothing is hashed and lookups always miss.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        super().__init__(num_blocks, block_size, enable_prefix_caching)
        self.req_blocks: dict[int, BlockTable] = {}  # request seq -> block ids
        # HEAR hooks (module docstring); empty while unused. Keep the instance (all three
        # layers) under 30 attributes: CPython shares (and fast-paths) instance dict keys up
        # to 29.
        self.host_loads: list[tuple[SimRequest, int]] = []
        self._caps: dict[int, int] = {}  # request seq -> most blocks it may hold (kv_budget)

    # -- views -----------------------------------------------------------------------------

    def blocks_of(self, req: SimRequest) -> list[int]:
        """`req`'s block ids in order (a new list)."""
        table = self.req_blocks.get(req.seq)
        return [] if table is None else table.tolist()

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
            return NO_BLOCKS  # most decode steps: no block to take, none newly full
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

        if num_new > MAX_SCALAR_BLOCKS:
            new_arr = self._pop_free_array(num_new)
        elif num_new:
            new_arr = np.array(self._pop_free(num_new), dtype=np.int64)
        else:
            new_arr = NO_BLOCKS
        if num_new:
            blocks.extend(new_arr)
        if self.enable_prefix_caching:
            if admission:  # prefix hits are cached already, hashing resumes after them
                self.num_cached_blocks[req.seq] = num_computed
            if lookup is not None and (
                lookup[0] is not req or len(blocks) > num_new + num_computed
            ):
                lookup = None  # not this request's admission
            # the blocks past the cached ones are all freshly taken (taking unhashes them)
            # unless prefix hits were just appended to a table that held blocks already
            fresh = hits is None or admission
            self._cache_full_blocks(req, blocks.view(), num_total_tokens, lookup, uncached, fresh)
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
            # the blocks a decode run appended: freshly taken, unhashed
            self._cache_full_blocks(req, self.req_blocks[req.seq].view(), num_tokens, fresh=True)

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
        # tail first, as a contiguous copy: it becomes a queue segment, and numpy's gathers and
        # scatters through a negative-stride index array (the plain reversed view) cost ~2x
        arr = blocks.view()[::-1].copy()
        left = self.ref_cnt.take(arr)
        left -= 1
        self.ref_cnt[arr] = left
        zero = arr if not np.count_nonzero(left) else arr[left == 0]
        if len(zero):
            self._push_free(zero)

    # -- HEAR: prepared loads, compression -------------------------------------------------

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
        arr = tail[::-1].copy()
        self.ref_cnt[arr] -= 1
        zero = arr[self.ref_cnt[arr] == 0]
        if len(zero):
            self._push_free(zero)
        return len(tail)

    def is_compressed(self, req: SimRequest) -> bool:
        return req.seq in self._caps

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
