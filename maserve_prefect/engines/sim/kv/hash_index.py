"""`HashIndex`: which KV block caches which block hash — vLLM's `cached_block_hash_to_block` in
numpy, so that hashing or looking up a long prompt is a few array operations, not a dict
operation per block.

One idea: the block arrays are the truth (`hashed[b]`, `hash_val[b]`), and the index only has to
*point* at the right block. A direct-mapped table `table[h & mask] -> block` does that for almost
every hash; an entry is trusted only while that block still holds that hash, so eviction is just
`hashed[b] = False` and stale entries are overwritten later. A hash whose slot is taken by another
live hash goes to a small overflow dict (its slot is flagged so lookups know to look there); the
table has ~128 slots per block, so that is rare. Within one `add` call the hashes are distinct
(they are one request's chained block hashes), as vLLM assumes too.

Speed notes (a long prompt is thousands of blocks, so each array pass counts): the blocks of one
prefix block get consecutive hashes (`request.py`), hence consecutive slots, so a prompt touches
a few table cache lines per prefix block; gathers use `take`, cheaper than fancy indexing; slots
are the hashes' low bits reinterpreted in place; the table holds uint16 block ids while they fit.
`chains` (the prefix keys added hashes derive from) lets the KV cache skip looking up blocks that
cannot be cached. (Folding the overflow flag into the table entries, or keeping a per-block
home-slot array, measured slower.)

Deferred table entries (`add_deferred`): a prompt's hashes derived from prefix keys are marked
cached in the block arrays at once (so eviction and `still_cached` see them), but their table
entries wait, filed under the prefix keys they derive from, until a lookup asks about one of
those keys (`flush_keys`) or about hashes of unknown keys (`find` / `find_one` flush all). Most
prefix units of a trace are never asked about again on the replica that cached them, so the
table work per request follows the units that are looked up, not every block; an answer is the
same as with eager entries, since an entry only points and `find` checks the block arrays.

Examples:
    >>> import numpy as np
    >>> idx = HashIndex(num_blocks=4)
    >>> idx.add(np.array([2]), np.array([99], dtype=np.uint64))
    >>> idx.find(np.array([99, 5], dtype=np.uint64)).tolist()
    [2, -1]
"""

from __future__ import annotations

import numpy as np

_SLOTS_PER_BLOCK = 128
_MAX_TABLE_BITS = 22  # 4M slots: 8 MiB of uint16 entries


class HashIndex:
    """Hash -> block for the cached (full, hashed) blocks of one KV pool.

    Args:
        num_blocks: blocks in the pool.
        table_bits: log2 of the direct-mapped table size (default: ~128 slots per block).
    """

    def __init__(self, num_blocks: int, table_bits: int | None = None) -> None:
        if table_bits is None:
            table_bits = min(_MAX_TABLE_BITS, (num_blocks * _SLOTS_PER_BLOCK - 1).bit_length())
            table_bits = max(10, table_bits)
        # one extra, never hashed block `num_blocks` marks an empty table slot (no -1 checks)
        self._empty = num_blocks
        self.hashed = np.zeros(num_blocks + 1, dtype=bool)
        self.hash_val = np.zeros(num_blocks + 1, dtype=np.uint64)
        self._imask = (1 << table_bits) - 1
        self._mask = np.uint64(self._imask)
        # uint16 entries while block ids fit: a smaller table stays in cache
        dtype = np.uint16 if num_blocks < 1 << 16 else np.int32
        self._table = np.full(1 << table_bits, num_blocks, dtype=dtype)
        # slot has overflow entries; written through now (as the table is), not left to the
        # first spill: a lazily zeroed page (a 2 MiB huge page) costs ~1 ms on first write
        self._flag = np.full(1 << table_bits, False)
        self._overflow: dict[int, int] = {}
        self._max_overflow = 256 + num_blocks // 4
        # prefix keys (`SimRequest.prefix_keys`) some added hash derives from: a hash
        # derived from any other key is cached nowhere, so it need not be looked up.
        # None once hashes of unknown origin were added (then every hash is looked up).
        self.chains: set[int] | None = set()
        # deferred table entries (module docstring): batches of (blocks, hashes), and per prefix
        # key the batches holding hashes derived from it; a flushed batch becomes None
        self._pending: list[tuple[np.ndarray, np.ndarray] | None] = []
        self._pending_by_key: dict[int, list[int]] = {}
        self._num_pending_pairs = 0  # compaction past `_max_pending_pairs` bounds the memory
        self._max_pending_pairs = 8 * num_blocks + 1024

    def reset(self) -> None:
        """Forget every hash."""
        self.hashed[:] = False
        self._table[:] = self._empty
        self._flag[:] = False
        self._overflow = {}
        self.chains = set()
        self._pending = []
        self._pending_by_key = {}
        self._num_pending_pairs = 0

    def add_deferred(self, blocks: np.ndarray, hashes: np.ndarray, key: int | None) -> None:
        """`add`, with the table entries left for `flush_keys([key, ...])` (or a full flush).

        `key` is the first prefix key the hashes derive from: keys are prefix-closed (a key
        names its whole chain), so a lookup that may find one of these hashes walks through
        `key` first; or any other int the caller's lookups flush by (the prefix cache files a
        request's unique blocks under a negative per-request key); None: only a full flush
        enters them. The arrays are kept, not copied: the caller passes arrays nobody writes
        to later (a block table's filled part, a request's hash memo)."""
        self.hashed[blocks] = True
        self.hash_val[blocks] = hashes
        self._num_pending_pairs += len(blocks)
        if self._num_pending_pairs > self._max_pending_pairs:
            self._compact()
        i = len(self._pending)
        self._pending.append((blocks, hashes))
        if key is not None:
            ids = self._pending_by_key.get(key)
            if ids is None:
                self._pending_by_key[key] = [i]
            else:
                ids.append(i)

    @property
    def num_pending(self) -> int:
        """Batches whose table entries wait (0: the table is complete)."""
        return len(self._pending)

    def flush_keys(self, keys: list[int]) -> None:
        """Enter the deferred entries of hashes derived from `keys` in the table."""
        by_key = self._pending_by_key
        if not by_key:
            return
        pending = self._pending
        for k in keys:
            ids = by_key.pop(k, None)
            if ids is not None:
                for i in ids:
                    batch = pending[i]
                    if batch is not None:
                        pending[i] = None
                        self._enter_live(*batch)

    def _compact(self) -> None:
        """Drop the deferred pairs whose block was taken since (at most `num_blocks` pairs
        stay live, an eighth of `_max_pending_pairs`: memory stays bounded, nothing enters)."""
        # per batch, not all at once: concatenating every pending pair (~200k at 8 H100
        # replicas) into fresh arrays costs more in page faults than the per-batch calls
        hashed, hash_val = self.hashed, self.hash_val
        kept: list[tuple[np.ndarray, np.ndarray] | None] = []
        moved: dict[int, int] = {}
        for i, batch in enumerate(self._pending):
            if batch is None:
                continue
            blocks, hashes = batch
            live = hashed.take(blocks)
            live &= hash_val.take(blocks) == hashes
            n = int(np.count_nonzero(live))
            if n:
                moved[i] = len(kept)
                kept.append(batch if n == len(blocks) else (blocks[live], hashes[live]))
        by_key: dict[int, list[int]] = {}
        for key, ids in self._pending_by_key.items():
            left = [moved[i] for i in ids if i in moved]
            if left:
                by_key[key] = left
        self._pending, self._pending_by_key = kept, by_key
        self._num_pending_pairs = sum(len(b[0]) for b in kept if b is not None)

    def flush(self) -> None:
        """Enter every deferred entry in the table (in the order they were deferred)."""
        pending = self._pending
        self._pending = []
        self._pending_by_key = {}
        self._num_pending_pairs = 0
        for batch in pending:
            if batch is not None:
                self._enter_live(*batch)

    def _enter_live(self, blocks: np.ndarray, hashes: np.ndarray) -> None:
        """Table entries for the deferred (block, hash) pairs still cached (a block taken since
        holds no hash or another one: its pair is dropped)."""
        live = self.hashed.take(blocks)
        live &= self.hash_val.take(blocks) == hashes
        if not np.count_nonzero(live):
            return
        if np.count_nonzero(live) < len(live):
            blocks, hashes = blocks[live], hashes[live]
        self._enter(blocks, hashes)

    def find(self, hashes: np.ndarray) -> np.ndarray:
        """The block caching each hash (uint64 array), -1 where none does (an intp array)."""
        if self._pending:
            self.flush()
        return self.find_entered(hashes)

    def find_entered(self, hashes: np.ndarray) -> np.ndarray:
        """`find` without flushing: for hashes whose deferred entries were flushed
        (`flush_keys` of the keys they derive from)."""
        slots = self._slots(hashes)
        blocks = self._table.take(slots).astype(np.intp)
        found = self.hashed.take(blocks)
        found &= self.hash_val.take(blocks) == hashes
        if self._overflow:
            flagged = self._flag.take(slots)
            flagged &= ~found
            if np.count_nonzero(flagged):
                for i in flagged.nonzero()[0].tolist():
                    h = int(hashes[i])
                    b = self._overflow.get(h, -1)
                    if b >= 0 and self.hashed[b] and int(self.hash_val[b]) == h:
                        blocks[i] = b
                        found[i] = True
        if np.count_nonzero(found) < len(found):
            blocks[~found] = -1
        return blocks

    def _slots(self, hashes: np.ndarray) -> np.ndarray:
        """Table slot of each hash: its low bits, reinterpreted as intp (no copy; they fit)."""
        return (hashes & self._mask).view(np.intp)

    def still_cached(self, blocks: np.ndarray, hashes: np.ndarray) -> np.ndarray:
        """Whether `blocks[i]` still caches `hashes[i]` (a bool array; block -1: no), for
        blocks an earlier `find` returned: only those found then are looked at."""
        out = np.zeros(len(blocks), dtype=bool)
        pos = (blocks >= 0).nonzero()[0]
        if len(pos):
            b = blocks.take(pos)
            out[pos] = self.hashed.take(b) & (self.hash_val.take(b) == hashes.take(pos))
        return out

    def find_one(self, h: int) -> int:
        """The block caching hash `h`, or -1 (scalar path: no numpy call overhead)."""
        if self._pending:
            self.flush()
        return self.find_one_entered(h)

    def find_one_entered(self, h: int) -> int:
        """`find_one` without flushing (see `find_entered`)."""
        slot = h & self._imask
        b = int(self._table[slot])
        if self.hashed[b] and int(self.hash_val[b]) == h:
            return b
        if self._flag[slot]:
            b = self._overflow.get(h, -1)
            if b >= 0 and self.hashed[b] and int(self.hash_val[b]) == h:
                return b
        return -1

    def add_one(self, b: int, h: int) -> None:
        """`add` for one block."""
        slot = h & self._imask
        occ = int(self._table[slot])
        taken = self.hashed[occ] and int(self.hash_val[occ]) & self._imask == slot
        self.hashed[b] = True
        self.hash_val[b] = h
        if taken:
            self._spill(np.array([b]), np.array([h], dtype=np.uint64), np.array([slot]))
        else:
            self._table[slot] = b

    def add(self, blocks: np.ndarray, hashes: np.ndarray) -> None:
        """Cache `hashes[i]` in `blocks[i]`: the blocks hold no hash, the hashes no block."""
        self._enter(blocks, hashes)
        self.hashed[blocks] = True
        self.hash_val[blocks] = hashes

    def _enter(self, blocks: np.ndarray, hashes: np.ndarray) -> None:
        """Table entries for cached (block, hash) pairs (the block arrays already say so)."""
        masked = hashes & self._mask
        slots = masked.view(np.intp)
        table = self._table
        occ = table.take(slots).astype(np.intp)
        # a slot is taken while its block is hashed with a hash of that slot: it keeps it
        taken = self.hashed.take(occ)
        any_taken = np.count_nonzero(taken) > 0
        if any_taken:
            taken &= (self.hash_val.take(occ) & self._mask) == masked
            any_taken = np.count_nonzero(taken) > 0
        table[slots] = np.where(taken, occ, blocks) if any_taken else blocks
        # a taken slot, or two new hashes sharing a slot: the one the table lacks overflows
        lost = table.take(slots) != blocks
        if np.count_nonzero(lost):
            self._spill(blocks[lost], hashes[lost], slots[lost])

    def _spill(self, blocks: np.ndarray, hashes: np.ndarray, slots: np.ndarray) -> None:
        self._flag[slots] = True
        over = self._overflow
        over.update(zip(hashes.tolist(), blocks.tolist(), strict=True))
        if len(over) > self._max_overflow:  # drop entries whose block moved on
            keys = np.fromiter(over.keys(), np.uint64, len(over))
            vals = np.fromiter(over.values(), np.intp, len(over))
            live = self.hashed[vals] & (self.hash_val[vals] == keys)
            # the flags are the slots of the entries: clear the dropped ones' and set the
            # kept ones' again (a slot may hold both), not the whole table's
            self._flag[self._slots(keys[~live])] = False
            keys, vals = keys[live], vals[live]
            self._overflow = dict(zip(keys.tolist(), vals.tolist(), strict=True))
            self._flag[self._slots(keys)] = True

    def evict(self, blocks: np.ndarray | list[int]) -> None:
        """The blocks get new contents: their hashes are no longer cached."""
        self.hashed[blocks] = False

    def evict_one(self, b: int) -> None:
        """`evict` for one block."""
        self.hashed[b] = False

    def entered(self) -> set[int]:
        """The cached hashes that have a table (or overflow) entry now, deferred ones not yet
        entered excluded (for tests and checks: builds arrays the size of the table)."""
        occ = self._table.astype(np.intp)
        slots = np.arange(len(occ), dtype=np.intp)
        live = self.hashed[occ] & ((self.hash_val[occ] & self._mask).view(np.intp) == slots)
        out = set(self.hash_val[occ[live]].tolist())
        out.update(
            h for h, b in self._overflow.items() if self.hashed[b] and int(self.hash_val[b]) == h
        )
        return out

    def block_hash(self) -> dict[int, int]:
        """Block id -> hash for every cached block (a copy)."""
        ids = np.flatnonzero(self.hashed[: self._empty])
        return dict(zip(ids.tolist(), self.hash_val[ids].tolist(), strict=True))
