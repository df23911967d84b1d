"""Prefix caching over the block pool: hashing full blocks and looking prompts up, following
vLLM v1's prefix cache (`BlockPool.cache_full_blocks`, `KVCacheManager.get_computed_blocks`).

Blocks carry, once full, a chained hash (see `request.py`), cached in the pool's `HashIndex`
(`kv/hash_index.py`): numpy arrays per block plus a direct-mapped table, so hashing or looking up a
prompt's blocks is vectorized, and eviction is one array write. A lookup hits at most
`num_tokens - 1` tokens, so at least one token is always computed. A duplicate of a cached block
stays uncached (vLLM keeps one). Hashed blocks stay cached while free, until the pool evicts them
(`kv/block_pool.py`).

The speed idea: lookups ask the index only about blocks that may be cached: a prompt given as
prefix-block hashes derives each block hash from its prefix key, and the index keeps the keys any
cached hash derives from (`_num_maybe_cached`); a chunked prefill's later chunks reuse the
admission lookup while it is valid (`_lookups`, `any_cached` of a `BlockRange`). Newly full
blocks of such a prompt are marked cached at once but enter the index's hash table only when a
lookup walks their prefix key (`HashIndex.add_deferred`): the table work per request follows the
sharing units that are looked up again, not every block. `cached` and
`block_hash` give the canonical view (built on demand, for tests and checks).

Counters follow vLLM's Prometheus `vllm:prefix_cache_queries_total` (tokens looked up) and
`vllm:prefix_cache_hits_total` (tokens hit), counted once per admission (re-admissions after
preemption included) via `record_lookup`. vLLM also counts the lookup of a queue head that then
fails to allocate, at every step it stays blocked, which ties its counter to the number of steps;
ours counts the lookup that admitted the request, so fast-forwarded and stepped runs agree.

The host tier (`host_tier.py`, a HEAR hook, inert until used): a lookup extends the GPU prefix
hit with the host tier's leading run (`_host_run`), which the admission's allocation takes out of
the host tier (`KVCacheManager.ensure`); `on_cache` sees every newly cached (block, hash).

Examples:
    >>> cache = PrefixCache(num_blocks=4, block_size=16)
    >>> cache.cached, cache.num_hit_tokens
    ({}, 0)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from maserve_prefect.engines.sim.kv.block_pool import MAX_SCALAR_BLOCKS, NO_BLOCKS, BlockPool
from maserve_prefect.engines.sim.request import SimRequest
from maserve_prefect.errors import ConfigError

if TYPE_CHECKING:
    from maserve_prefect.engines.sim.kv.host_tier import HostTier


_NOT_FOUND = np.zeros(0, dtype=np.intp)  # shared empty lookup answer (never written)


def _own_key(req: SimRequest) -> int:
    """The key `req`'s unique blocks (past its shareable prefix) file their deferred index
    entries under: negative, so no prefix key (a uint64) is ever equal to it."""
    return -1 - req.seq


def _found_span(found: np.ndarray) -> tuple[int, int]:
    """Of a lookup answer: how many leading entries are found (>= 0), and the length through
    its last found entry (the answer's short form: every entry past it is -1)."""
    n = len(found)
    if not n:
        return 0, 0
    missing = found < 0
    i = int(missing.argmax())
    if not missing[i]:
        return n, n
    j = int(missing[::-1].argmin())
    return i, (0 if missing[n - 1 - j] else n - j)


class BlockRange(NamedTuple):
    """Blocks `start..end-1` of `req` (what `any_cached` asks about a request's prompt)."""

    req: SimRequest
    start: int
    end: int


class PrefixCache(BlockPool):
    """Block hashes, prefix lookups and the prefix-cache counters over a `BlockPool`.

    The base of `KVCacheManager` (`kv/manager.py`), which hashes a request's blocks as they fill
    (`_cache_full_blocks`) and takes the blocks a lookup hit.

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
        super().__init__(num_blocks)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.num_cached_blocks: dict[int, int] = {}  # request seq -> blocks hashed so far
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0
        # (request, block per hash of its leading maybe-cached blocks, blocks covered): a
        # lookup's answer, short form (`_find_head`: blocks past the array are cached nowhere)
        self._lookup: tuple[SimRequest, np.ndarray, int] | None = None
        # request seq -> (epoch, its admission lookup, blocks covered), valid while `_epoch` is
        # unchanged: the count of hashing calls that cached shareable (cross-request) hashes
        self._lookups: dict[int, tuple[int, np.ndarray, int]] = {}
        self._epoch = 0
        # HEAR hooks (`kv/manager.py`); None while unused
        self.host: HostTier | None = None
        self.on_cache: Callable[[np.ndarray, np.ndarray], None] | None = None
        self._host_pending: tuple[SimRequest, list[int]] | None = None

    # -- views -----------------------------------------------------------------------------

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

    def block_of(self, block_hash: int) -> int:
        """The GPU block caching `block_hash`, or -1."""
        return self._idx.find_one(block_hash)

    # -- lookup ----------------------------------------------------------------------------

    def get_computed_blocks(self, req: SimRequest) -> tuple[list[int], int]:
        """Longest cached prefix of `req`'s full blocks, capped at `num_tokens - 1` tokens."""
        hits, num_hit_tokens = self.lookup_prefix(req)
        return hits.tolist(), num_hit_tokens

    def lookup_prefix(self, req: SimRequest) -> tuple[np.ndarray, int]:
        """`get_computed_blocks` with the hit blocks as an int64 array (the scheduler's form:
        `ensure_slots` takes it as is)."""
        if not self.enable_prefix_caching:
            return NO_BLOCKS, 0
        max_blocks = (req.num_tokens - 1) // self.block_size
        if max_blocks <= 0:
            return NO_BLOCKS, 0
        hashes = req.block_hash_array(max_blocks)[:max_blocks]
        if max_blocks <= MAX_SCALAR_BLOCKS:
            found_small: list[int] = []
            # blocks past the first `maybe` are cached nowhere (`_num_maybe_cached`)
            maybe = self._num_maybe_cached(req, max_blocks)
            for h in hashes[:maybe].tolist():
                b = self._idx.find_one_entered(h)
                if b < 0:
                    break
                found_small.append(b)
            hits = np.array(found_small, dtype=np.int64)
        else:
            found = self._find_head(req, hashes, 0, max_blocks)
            num_hits, end = _found_span(found)
            # the admission's hashing reuses it (`_cache_full_blocks`), in short form through
            # its last found block: most prompts find nothing past their hit, so the hashing
            # of their other blocks has no duplicate to check
            self._lookup = (req, found[:end], max_blocks)
            hits = found[:num_hits]
        if self.host is not None and len(hits) < max_blocks:
            return hits, (len(hits) + self._host_run(req, hashes, len(hits))) * self.block_size
        return hits, len(hits) * self.block_size

    def probe_prefix(self, req: SimRequest) -> int:
        """Prompt tokens of `req` a lookup would hit on the GPU now, changing nothing: a
        router's question ("how much of this prompt does this replica hold?"), asked before the
        request is sent anywhere.

        Only the shareable prefix can hit (later blocks are unique to a request), and the
        prefix chains no cached hash derives from are ruled out per prefix block
        (`_num_maybe_cached`) before any block is looked up, so a replica that never held the
        prompt's prefix answers in work per sharing unit, not per block. Same cap as a lookup:
        at most `num_tokens - 1` tokens.
        """
        if not self.enable_prefix_caching:
            return 0
        max_blocks = min((req.num_tokens - 1) // self.block_size, req.num_shareable_blocks)
        if max_blocks <= 0:
            return 0
        n = self._num_maybe_cached(req, max_blocks)
        if n <= 0:
            return 0
        found = self._idx.find_entered(req.block_hash_array(n)[:n])
        misses = np.flatnonzero(found < 0)
        return (int(misses[0]) if len(misses) else n) * self.block_size

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
                cached = self._find_head(req, hashes, start, end) >= 0
            else:
                was = was[start:end]
                cached = self._idx.still_cached(was, hashes[: len(was)])
        else:
            cached = self._idx.find(hashes) >= 0
        if np.count_nonzero(cached):
            return True
        host = self.host
        return host is not None and len(host) > 0 and host.any_of(hashes.tolist())

    def _find_head(self, req: SimRequest, hashes: np.ndarray, start: int, end: int) -> np.ndarray:
        """`HashIndex.find` of `req`'s block hashes `start..end-1` (`hashes`), asking the index
        only about the blocks that may be cached (`_num_maybe_cached`), in short form: the
        answers for the leading maybe-cached blocks only (the blocks past the returned array
        are cached nowhere), so no array the length of the prompt is built or scanned."""
        n = self._num_maybe_cached(req, end) - start
        if n >= len(hashes):
            return self._idx.find_entered(hashes)
        return self._idx.find_entered(hashes[:n]) if n > 0 else _NOT_FOUND

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

        The index's deferred entries for those blocks are entered (`HashIndex.flush_keys` of
        the keys walked over), so `find_entered` answers for them. A preempted request may
        find any of its blocks (nothing is ruled out): the entries of every prefix key of its
        own and of its unique blocks (filed under `_own_key`) are entered, which is every
        batch that can hold one of its hashes; the index's other deferred entries stay
        deferred. Prompts given as token ids, or hashes of unknown origin: a full flush.
        """
        idx = self._idx
        chains = idx.chains
        if chains is None or not req.has_prefix_chain:
            if idx.num_pending:
                idx.flush()
            return end
        if req.num_preemptions:
            if idx.num_pending:
                idx.flush_keys([*req.prefix_keys().tolist(), _own_key(req)])
            return end
        keys = []
        for c in req.prefix_keys().tolist():
            if c not in chains:
                break
            keys.append(c)
        if keys and idx.num_pending:
            idx.flush_keys(keys)
        return min(end, req.num_blocks_within(len(keys)), req.num_shareable_blocks)

    def _kept_lookup(self, req: SimRequest, end: int) -> np.ndarray | None:
        """`req`'s kept lookup (block per hash at its admission, short form: see `_find_head`)
        if still valid and covering blocks `0..end-1`."""
        kept = self._lookups.get(req.seq)
        if kept is None or kept[0] != self._epoch or kept[2] < end:
            return None
        return kept[1]

    def record_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count an admitted request's prefix lookup (queries and hits, in tokens). Host-tier
        hits count in `host.num_hit_tokens`: the admission's load took them off the GPU hits
        in advance (`_commit_host_load`)."""
        self.num_queried_tokens += num_tokens
        self.num_hit_tokens += num_hit_tokens

    # -- hashing ---------------------------------------------------------------------------

    def _cache_full_blocks(
        self,
        req: SimRequest,
        blocks: np.ndarray,
        num_tokens: int,
        lookup: tuple[SimRequest, np.ndarray, int] | None = None,
        uncached: bool = False,
        fresh: bool = False,
    ) -> None:
        """Hash the blocks `num_tokens` tokens fill; a duplicate of a cached block stays unhashed.

        `blocks` is `req`'s block table (`BlockTable.view()`; its filled part is never
        rewritten, so the index may keep views of it). `fresh`: the caller knows the blocks
        past the cached ones hold no hash (taken since, not prefix hits), so they are not
        checked. Which of the new hashes are cached elsewhere already (duplicates) is asked of
        the index only where the answer can be yes and is not known:
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
        if num_full - start <= MAX_SCALAR_BLOCKS:
            # blocks from `maybe` on are cached nowhere (see `check_end`, `_num_maybe_cached`,
            # which also enters the index's deferred entries the lookups below need)
            maybe = self._num_maybe_cached(req, check_end) if check_end > start else start
            for j, (b, h) in enumerate(
                zip(blocks[start:num_full].tolist(), sh.tolist(), strict=True), start
            ):
                # a hit block is hashed already; a duplicate stays uncached (vLLM keeps one)
                if not idx.hashed[b] and (j >= maybe or idx.find_one_entered(h) < 0):
                    idx.add_one(b, h)
                    if self.on_cache is not None:
                        self.on_cache(np.array([b]), np.array([h], dtype=np.uint64))
        else:
            sb = blocks[start:num_full]
            # blocks to leave unhashed: a hit block is hashed already (None: none is)
            skip = None if fresh else idx.hashed.take(sb)
            n_check = 0 if uncached else check_end - start
            if n_check:
                # a lookup's short form: blocks past its array are cached nowhere
                if lookup is not None and lookup[2] >= check_end:
                    was = lookup[1][start:check_end]
                elif kept is not None and kept[2] >= check_end:
                    was = kept[1][start:check_end]
                else:
                    was = None
                if was is None:
                    dup = self._find_head(req, sh[:n_check], start, check_end) >= 0
                elif len(was):
                    dup = idx.still_cached(was, sh[: len(was)])
                else:
                    dup = None
                if dup is not None and np.count_nonzero(dup):
                    # a duplicate stays uncached (vLLM keeps one)
                    if skip is None:
                        skip = np.zeros(len(sb), dtype=bool)
                    skip[: len(dup)] |= dup
            if skip is not None and np.count_nonzero(skip):
                keep = ~skip
                sb, sh = sb[keep], sh[keep]
            # table entries wait until a lookup asks about their prefix keys (`HashIndex`);
            # blocks past the shareable prefix, until `req`'s own re-admission asks (or a full
            # flush); a token-id prompt's, until a full flush
            key = None
            if req.has_prefix_chain:
                if start < n_shared:
                    key = int(req.prefix_keys()[req.prefix_positions(start, start + 1)[0]])
                else:
                    key = _own_key(req)
            idx.add_deferred(sb, sh, key)
            if self.on_cache is not None and len(sb):
                self.on_cache(sb, sh)
        if lookup is not None:
            self._lookups[req.seq] = (self._epoch, lookup[1], lookup[2])
        elif kept is not None:
            self._lookups[req.seq] = (self._epoch, kept[1], kept[2])
