"""`HashIndex`: which KV block caches which block hash — vLLM's `cached_block_hash_to_block` in
numpy, so that hashing or looking up a long prompt is a few array operations, not a dict
operation per block.

One idea: the block arrays are the truth (`hashed[b]`, `hash_val[b]`), and the index only has to
*point* at the right block. A direct-mapped table `table[h & mask] -> block` does that for almost
every hash; an entry is trusted only while that block still holds that hash, so eviction is just
`hashed[b] = False` and stale entries are overwritten later. A hash whose slot is taken by another
live hash goes to a small overflow dict (its slot is flagged so lookups know to look there); the
table has ~32 slots per block, so that is rare. Within one `add` call the hashes are distinct
(they are one request's chained block hashes), as vLLM assumes too.

Examples:
    >>> import numpy as np
    >>> idx = HashIndex(num_blocks=4)
    >>> idx.add(np.array([2]), np.array([99], dtype=np.uint64))
    >>> idx.find(np.array([99, 5], dtype=np.uint64)).tolist()
    [2, -1]
"""

from __future__ import annotations

import numpy as np

_SLOTS_PER_BLOCK = 32


class HashIndex:
    """Hash -> block for the cached (full, hashed) blocks of one KV pool.

    Args:
        num_blocks: blocks in the pool.
        table_bits: log2 of the direct-mapped table size (default: ~32 slots per block).
    """

    def __init__(self, num_blocks: int, table_bits: int | None = None) -> None:
        if table_bits is None:
            table_bits = max(10, (num_blocks * _SLOTS_PER_BLOCK - 1).bit_length())
        # one extra, never hashed block `num_blocks` marks an empty table slot (no -1 checks)
        self._empty = num_blocks
        self.hashed = np.zeros(num_blocks + 1, dtype=bool)
        self.hash_val = np.zeros(num_blocks + 1, dtype=np.uint64)
        self._imask = (1 << table_bits) - 1
        self._mask = np.uint64(self._imask)
        self._table = np.full(1 << table_bits, num_blocks, dtype=np.int32)
        self._flag = np.zeros(1 << table_bits, dtype=bool)  # slot has overflow entries
        self._overflow: dict[int, int] = {}
        self._max_overflow = 256 + num_blocks // 4

    def reset(self) -> None:
        """Forget every hash."""
        self.hashed[:] = False
        self._table[:] = self._empty
        self._flag[:] = False
        self._overflow = {}

    def find(self, hashes: np.ndarray) -> np.ndarray:
        """The block caching each hash (uint64 array), -1 where none does."""
        slots = (hashes & self._mask).astype(np.intp)
        blocks = self._table[slots]
        found = self.hashed[blocks] & (self.hash_val[blocks] == hashes)
        out = np.where(found, blocks, -1)
        if self._overflow:
            for i in np.flatnonzero(self._flag[slots] & ~found).tolist():
                b = self._overflow.get(int(hashes[i]), -1)
                if b >= 0 and self.hashed[b] and int(self.hash_val[b]) == int(hashes[i]):
                    out[i] = b
        return out

    def find_one(self, h: int) -> int:
        """The block caching hash `h`, or -1 (scalar path: no numpy call overhead)."""
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
        masked = hashes & self._mask
        slots = masked.astype(np.intp)
        table = self._table
        occ = table[slots]
        # a slot is taken while its block is hashed with a hash of that slot: it keeps it
        taken = self.hashed[occ] & ((self.hash_val[occ] & self._mask) == masked)
        self.hashed[blocks] = True
        self.hash_val[blocks] = hashes
        table[slots] = np.where(taken, occ, blocks)
        # a taken slot, or two new hashes sharing a slot: the one the table lacks overflows
        lost = table[slots] != blocks
        if lost.any():
            self._spill(blocks[lost], hashes[lost], slots[lost])

    def _spill(self, blocks: np.ndarray, hashes: np.ndarray, slots: np.ndarray) -> None:
        self._flag[slots] = True
        self._overflow.update(zip(hashes.tolist(), blocks.tolist(), strict=True))
        if len(self._overflow) > self._max_overflow:  # drop entries whose block moved on
            live = {
                h: b
                for h, b in self._overflow.items()
                if self.hashed[b] and int(self.hash_val[b]) == h
            }
            self._overflow = live
            self._flag[:] = False
            if live:
                keys = np.fromiter(live.keys(), np.uint64, len(live))
                self._flag[(keys & self._mask).astype(np.intp)] = True

    def evict(self, blocks: np.ndarray | list[int]) -> None:
        """The blocks get new contents: their hashes are no longer cached."""
        self.hashed[blocks] = False

    def block_hash(self) -> dict[int, int]:
        """Block id -> hash for every cached block (a copy)."""
        ids = np.flatnonzero(self.hashed[: self._empty])
        return dict(zip(ids.tolist(), self.hash_val[ids].tolist(), strict=True))
