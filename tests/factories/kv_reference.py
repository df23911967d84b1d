"""Reference KV cache for differential tests: vLLM v1's block pool kept block by block.

This is the simulator's previous `KVCacheManager` (one `OrderedDict` entry per free block, one
dict entry per cached hash), kept as the executable definition of the eviction order that the
segment-based `engines/sim/kv/block_pool.py` must reproduce exactly.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence

from maserve_prefect.engines.sim.request import SimRequest
from maserve_prefect.errors import ConfigError, SimulationError

_LOOKUP_CHUNK = 64


def _consume(it: Iterable[object]) -> None:
    deque(it, maxlen=0)


class ReferenceKV:
    """The per-block LRU (an `OrderedDict` of block ids) the segment queue must match.

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
        self.ref_cnt = [0] * num_blocks
        self.block_hash: dict[int, int] = {}  # block id -> hash, for hashed blocks only
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[int, int] = {}  # hash -> block id
        self.req_blocks: dict[int, list[int]] = {}  # request seq -> block ids
        self.num_cached_blocks: dict[int, int] = {}  # request seq -> blocks hashed so far
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0

    # -- views -----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free_queue) / self.num_blocks

    def blocks_of(self, req: SimRequest) -> list[int]:
        return self.req_blocks.get(req.seq, [])

    # -- lookup ----------------------------------------------------------------------------

    def get_computed_blocks(self, req: SimRequest) -> tuple[list[int], int]:
        """Longest cached prefix of `req`'s full blocks, capped at `num_tokens - 1` tokens."""
        if not self.enable_prefix_caching:
            return [], 0
        max_blocks = (req.num_tokens - 1) // self.block_size
        if max_blocks <= 0:
            return [], 0
        hashes = req.block_hashes(max_blocks)
        get = self.cached.get
        hits: list[int] = []
        n = 0
        while n < max_blocks:  # in chunks: a miss near the front stops the lookup early
            end = min(n + _LOOKUP_CHUNK, max_blocks)
            chunk = list(map(get, hashes[n:end]))
            if None in chunk:
                hits.extend(chunk[: chunk.index(None)])  # type: ignore[arg-type]
                break
            hits.extend(chunk)  # type: ignore[arg-type]
            n = end
        return hits, len(hits) * self.block_size

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
        self, req: SimRequest, num_total_tokens: int, computed_blocks: Sequence[int] = ()
    ) -> list[int] | None:
        """Make `req` hold blocks for `num_total_tokens` tokens and hash the ones they fill."""
        blocks = self.req_blocks.get(req.seq)
        if blocks is None:
            blocks = self.req_blocks[req.seq] = []
        num_required = -(-num_total_tokens // self.block_size)
        num_new = num_required - len(blocks) - len(computed_blocks)
        if num_new < 0:
            num_new = 0
        ref = self.ref_cnt
        free_queue = self.free_queue
        num_evictable_hits = list(map(ref.__getitem__, computed_blocks)).count(0)
        if num_new + num_evictable_hits > len(free_queue):
            if not blocks:
                del self.req_blocks[req.seq]
            return None
        for b in computed_blocks:  # touch: a free cached block leaves the LRU queue
            if ref[b] == 0:
                del free_queue[b]
            ref[b] += 1
        blocks.extend(computed_blocks)
        new_blocks = self._pop_free(num_new) if num_new else []
        blocks.extend(new_blocks)
        if self.enable_prefix_caching:
            self._cache_full_blocks(req, blocks, num_total_tokens)
        return new_blocks

    def _pop_free(self, n: int) -> list[int]:
        """Take the `n` least recently freed blocks, evicting their hashes (they get new tokens)."""
        free_queue = self.free_queue
        taken = list(itertools.islice(free_queue, n))
        _consume(map(free_queue.__delitem__, taken))
        _consume(map(self.ref_cnt.__setitem__, taken, itertools.repeat(1)))
        block_hash = self.block_hash
        if block_hash:
            evicted = list(block_hash.keys() & taken)
            if evicted:
                cached = self.cached
                hashes = list(map(block_hash.pop, evicted))
                holders = list(map(cached.get, hashes))
                _consume(
                    map(
                        cached.__delitem__,
                        [h for h, b, c in zip(hashes, evicted, holders, strict=True) if b == c],
                    )
                )
        return taken

    def _cache_full_blocks(self, req: SimRequest, blocks: list[int], num_tokens: int) -> None:
        start = self.num_cached_blocks.get(req.seq, 0)
        num_full = min(num_tokens // self.block_size, len(blocks))
        if num_full <= start:
            return
        seg_h = req.block_hashes(num_full)[start:num_full]
        seg_b = blocks[start:num_full]
        block_hash, cached = self.block_hash, self.cached
        if block_hash.keys().isdisjoint(seg_b) and cached.keys().isdisjoint(seg_h):
            cached.update(
                zip(seg_h, seg_b, strict=True)
            )  # the common case: fresh blocks, fresh hashes
            block_hash.update(zip(seg_b, seg_h, strict=True))
        else:
            for b, h in zip(seg_b, seg_h, strict=True):
                # a hit block is hashed already; a duplicate stays uncached (vLLM keeps one)
                if b not in block_hash and h not in cached:
                    cached[h] = b
                    block_hash[b] = h
        self.num_cached_blocks[req.seq] = num_full

    def free(self, req: SimRequest) -> None:
        """Release `req`'s blocks, tail first onto the free queue; hashed blocks stay cached."""
        blocks = self.req_blocks.pop(req.seq, None)
        self.num_cached_blocks.pop(req.seq, None)
        if not blocks:
            return
        ref = self.ref_cnt
        free_queue = self.free_queue
        blocks.reverse()
        for b in blocks:
            ref[b] -= 1
        if list(map(ref.__getitem__, blocks)).count(0) == len(blocks):
            free_queue.update(dict.fromkeys(blocks))
        else:
            free_queue.update(dict.fromkeys(b for b in blocks if ref[b] == 0))

    def compress(self, req: SimRequest, keep_blocks: int) -> int:
        """Drop `req`'s blocks past the first `keep_blocks` (freed tail first, hashed ones stay
        cached) and hash none of its blocks from now on (`KVCacheManager.compress`)."""
        self.num_cached_blocks[req.seq] = 1 << 62
        blocks = self.req_blocks.get(req.seq)
        if not blocks or len(blocks) <= keep_blocks:
            return 0
        tail = blocks[keep_blocks:]
        del blocks[keep_blocks:]
        tail.reverse()
        for b in tail:
            self.ref_cnt[b] -= 1
        self.free_queue.update(dict.fromkeys(b for b in tail if self.ref_cnt[b] == 0))
        return len(tail)

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
        self.block_hash = {}
        self.cached.clear()
        self.free_queue = OrderedDict.fromkeys(range(self.num_blocks))

    # -- checks ----------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Blocks conserved, ref counts match the block tables, the cache index is consistent."""
        expected = [0] * self.num_blocks
        for blocks in self.req_blocks.values():
            for b in blocks:
                expected[b] += 1
        if expected != self.ref_cnt:
            raise SimulationError("KV ref counts disagree with the request block tables")
        num_referenced = sum(1 for c in self.ref_cnt if c > 0)
        if num_referenced + len(self.free_queue) != self.num_blocks:
            raise SimulationError(
                f"KV blocks not conserved: {num_referenced} referenced + "
                f"{len(self.free_queue)} free != {self.num_blocks}"
            )
        if any(self.ref_cnt[b] != 0 for b in self.free_queue):
            raise SimulationError("a block on the free queue is still referenced")
        for h, b in self.cached.items():
            if self.block_hash.get(b) != h:
                raise SimulationError(f"cache index points block {b} at a stale hash")
