"""Paged KV cache with prefix caching, following vLLM v1's `BlockPool` + `KVCacheManager`.

Blocks carry a reference count and, once full, a chained hash (see `request.py`). Free blocks sit
in an LRU queue (an `OrderedDict` for O(1) removal from the middle): allocation pops the front and
evicts that block's hash if it had one; a prefix hit on a free cached block "touches" it (takes it
out of the queue). A finished or preempted request frees its blocks in *reverse* order, so its tail
blocks are evicted first and its hashed blocks stay reusable until evicted. A lookup hits at most
`num_tokens - 1` tokens, so at least one token is always computed. "Doesn't fit" is a value:
`allocate_slots` returns None and the scheduler decides whom to preempt.

Counters follow vLLM's Prometheus `vllm:prefix_cache_queries_total` (tokens looked up) and
`vllm:prefix_cache_hits_total` (tokens hit), counted once per admission (re-admissions after
preemption included) via `record_lookup`. vLLM also counts the lookup of a queue head that then
fails to allocate, at every step it stays blocked, which ties its counter to the number of steps;
ours counts the lookup that admitted the request, so fast-forwarded and stepped runs agree. `usage = 1 - free / num_blocks` (`vllm:kv_cache_usage_perc`).

Examples:
    >>> kv = KVCacheManager(num_blocks=4, block_size=16)
    >>> kv.usage
    0.0
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from maserve_prefect.engine.sim.request import SimRequest
from maserve_prefect.errors import ConfigError, SimulationError


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
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
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
        hits: list[int] = []
        for j in range(max_blocks):
            block = self.cached.get(req.block_hash(j))
            if block is None:
                break
            hits.append(block)
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
        blocks = self.req_blocks.setdefault(req.seq, [])
        num_required = cdiv(num_total_tokens, self.block_size)
        num_new = max(0, num_required - len(blocks) - len(computed_blocks))
        num_evictable_hits = sum(1 for b in computed_blocks if self.ref_cnt[b] == 0)
        if num_new + num_evictable_hits > len(self.free_queue):
            if not blocks:
                del self.req_blocks[req.seq]
            return None
        for b in computed_blocks:  # touch: a free cached block leaves the LRU queue
            if self.ref_cnt[b] == 0:
                del self.free_queue[b]
            self.ref_cnt[b] += 1
        blocks.extend(computed_blocks)
        new_blocks = [self._pop_free() for _ in range(num_new)]
        blocks.extend(new_blocks)
        if self.enable_prefix_caching:
            self._cache_full_blocks(req, blocks, num_total_tokens)
        return new_blocks

    def _pop_free(self) -> int:
        b, _ = self.free_queue.popitem(last=False)
        h = self.block_hash[b]
        if h is not None:  # evict: the block is about to hold other tokens
            if self.cached.get(h) == b:
                del self.cached[h]
            self.block_hash[b] = None
        self.ref_cnt[b] = 1
        return b

    def _cache_full_blocks(self, req: SimRequest, blocks: list[int], num_tokens: int) -> None:
        start = self.num_cached_blocks.get(req.seq, 0)
        num_full = min(num_tokens // self.block_size, len(blocks))
        for j in range(start, num_full):
            b = blocks[j]
            if self.block_hash[b] is None:
                h = req.block_hash(j)
                if h not in self.cached:  # a duplicate stays uncached (vLLM keeps one per hash)
                    self.cached[h] = b
                    self.block_hash[b] = h
        if num_full > start:
            self.num_cached_blocks[req.seq] = num_full

    def free(self, req: SimRequest) -> None:
        """Release `req`'s blocks, tail first onto the free queue; hashed blocks stay cached."""
        blocks = self.req_blocks.pop(req.seq, [])
        self.num_cached_blocks.pop(req.seq, None)
        for b in reversed(blocks):
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                self.free_queue[b] = None

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
        self.block_hash = [None] * self.num_blocks
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
            if self.block_hash[b] != h:
                raise SimulationError(f"cache index points block {b} at a stale hash")
