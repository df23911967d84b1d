"""A directory of the prefix-cache blocks a vLLM replica holds, kept from its KV events.

The one idea: replaying a server's `BlockStored` / `BlockRemoved` / `AllBlocksCleared` events
(decoded by `kv_decode`) into a `ResidencyDirectory` answers "which blocks of this prompt's prefix
are still resident, and where" without asking the engine; `reusable_prefix_blocks` stops at the
first missing block, as a prefix cache does.

Directory choices: a block is keyed by `(hash, medium)`, so a block offloaded to CPU and still on
GPU is two entries; a missing medium means GPU (vLLM's GPU block pool is the only publisher that
omits it, in versions before the field existed); media are upper-cased. `AllBlocksCleared`
(a prefix-cache reset) clears every medium: under-reporting residency costs a cache miss,
over-reporting it misroutes a request. Block hashes of different KV cache groups (hybrid models)
share one key space. A block's parent is the previous hash of its `BlockStored` event (the first
one's is `parent_block_hash`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from maserve_prefect.engines.openai.kv_decode import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    KVEvent,
)

__all__ = ["DEFAULT_MEDIUM", "BlockInfo", "ResidencyDirectory"]

DEFAULT_MEDIUM = "GPU"


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """A resident block: where, its parent in the prefix chain, its tokens, when it was stored."""

    medium: str
    parent: BlockHash | None
    num_tokens: int
    stored_at: float


def _medium(medium: str | None) -> str:
    return DEFAULT_MEDIUM if medium is None else medium.upper()


class ResidencyDirectory:
    """Block hash → where it is resident, maintained from KV events. Thread-safe.

    Counters: `num_stored` / `num_removed` count blocks (hashes) in store / remove events,
    `num_cleared` counts `AllBlocksCleared` events (and publisher restarts), `num_unknown`
    unknown events, `num_unmatched_removals` removals of a block the directory did not hold (a
    sign of lost events).

    Examples:
        >>> d = ResidencyDirectory()
        >>> d.apply(BlockStored((b"a", b"b"), None, (), 16, medium="CPU"), t_s=1.0)
        >>> d.resident(b"b"), d.resident(b"b", "GPU"), d.counts_by_medium()
        (True, False, {'CPU': 2})
        >>> d.info(b"b")
        BlockInfo(medium='CPU', parent=b'a', num_tokens=16, stored_at=1.0)
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._blocks: dict[BlockHash, dict[str, BlockInfo]] = {}
        self.num_stored = 0
        self.num_removed = 0
        self.num_cleared = 0
        self.num_unknown = 0
        self.num_unmatched_removals = 0

    def apply(self, event: KVEvent, t_s: float = 0.0) -> None:
        """Apply one event; `t_s` (the caller's clock) becomes `stored_at` of stored blocks."""
        with self._lock:
            if isinstance(event, BlockStored):
                self._store(event, t_s)
            elif isinstance(event, BlockRemoved):
                medium = _medium(event.medium)
                for h in event.block_hashes:
                    where = self._blocks.get(h)
                    if where is None or where.pop(medium, None) is None:
                        self.num_unmatched_removals += 1
                    elif not where:
                        del self._blocks[h]
                self.num_removed += len(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self.clear()
            else:
                self.num_unknown += 1

    def _store(self, event: BlockStored, t_s: float) -> None:
        medium, size = _medium(event.medium), event.block_size
        parent = event.parent_block_hash
        for i, h in enumerate(event.block_hashes):
            # vLLM caches full blocks only; without token ids (some connectors) trust block_size
            chunk = event.token_ids[i * size : (i + 1) * size]
            num_tokens = len(chunk) if event.token_ids else size
            self._blocks.setdefault(h, {})[medium] = BlockInfo(medium, parent, num_tokens, t_s)
            parent = h
        self.num_stored += len(event.block_hashes)

    def clear(self) -> None:
        """Forget every block (counted in `num_cleared`)."""
        with self._lock:
            self._blocks.clear()
            self.num_cleared += 1

    def resident(self, block_hash: BlockHash, medium: str | None = None) -> bool:
        """Whether the block is resident on `medium` (None: on any medium)."""
        with self._lock:
            where = self._blocks.get(block_hash)
            if not where:
                return False
            return medium is None or medium.upper() in where

    def info(self, block_hash: BlockHash, medium: str | None = None) -> BlockInfo | None:
        """The block's entry on `medium` (None: GPU if resident there, else any), or None."""
        with self._lock:
            where = self._blocks.get(block_hash) or {}
            if medium is not None:
                return where.get(medium.upper())
            return where.get(DEFAULT_MEDIUM) or next(iter(where.values()), None)

    def reusable_prefix_blocks(
        self, hashes: Iterable[BlockHash], media: Sequence[str] = ("GPU", "CPU")
    ) -> int:
        """Length of the leading run of `hashes` resident on any of `media`.

        A prefix cache can only reuse a prompt's blocks up to its first missing one, so the run
        stops there even if later blocks are resident.
        """
        wanted = {m.upper() for m in media}
        n = 0
        with self._lock:
            for h in hashes:
                if wanted.isdisjoint(self._blocks.get(h, ())):
                    break
                n += 1
        return n

    def num_blocks(self, medium: str | None = None) -> int:
        """Resident entries on `medium` (None: distinct hashes on any medium)."""
        with self._lock:
            if medium is None:
                return len(self._blocks)
            m = medium.upper()
            return sum(m in where for where in self._blocks.values())

    def counts_by_medium(self) -> dict[str, int]:
        """Resident blocks per medium."""
        counts: dict[str, int] = {}
        with self._lock:
            for where in self._blocks.values():
                for m in where:
                    counts[m] = counts.get(m, 0) + 1
        return dict(sorted(counts.items()))
