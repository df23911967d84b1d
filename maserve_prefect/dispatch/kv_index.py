"""A router's prefix index of real engines, kept from their KV events: the `prefix` route's probe
for endpoints (`dispatch.routes`).

One idea: a KV-aware router does not recompute the engine's block hashes (vLLM's are a seeded
hash of token ids and extra keys, which the router need not reproduce); it learns them from the
engine's `BlockStored` events, which carry each block's parent hash and token ids. Keying every
stored block by `(parent hash, its token ids)` lets a prompt given as token ids be walked block
by block from the root — each step one dict lookup — until a block is missing or no longer
resident (`BlockRemoved`, `AllBlocksCleared`, kept by the engine's `ResidencyDirectory`).
`EventPrefixProbe` answers the dispatcher's question per (replica, request) from one index per
replica, so the same `prefix` plan that places simulated requests places real ones.

Limits: a request needs `prompt_token_ids` (a text prompt would need the server's tokenizer and
chat template here: the probe answers 0 and the route falls back to least-loaded); blocks of
events without token ids cannot be matched; LoRA adapters and multimodal extra keys are not
told apart.

Examples:
    >>> from maserve_prefect.engines.openai.kv_decode import BlockStored, BlockRemoved
    >>> idx = KVEventIndex()
    >>> idx.apply(BlockStored((b"h1", b"h2"), None, tuple(range(8)), 4))
    >>> idx.cached_prefix_tokens(list(range(10)), 4), idx.cached_prefix_tokens([0, 1, 2, 9, 9], 4)
    (8, 0)
    >>> idx.apply(BlockRemoved((b"h2",)))
    >>> idx.cached_prefix_tokens(list(range(10)), 4)
    4
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from maserve_prefect.engines.openai.kv_decode import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    KVEvent,
)
from maserve_prefect.engines.openai.kv_residency import ResidencyDirectory
from maserve_prefect.protocol.engine import Replica
from maserve_prefect.protocol.requests import Request


class KVEventIndex:
    """(parent hash, token ids) -> block hash of one engine's stored blocks, with residency.

    Args:
        media: the KV media a hit may come from (vLLM: "GPU", and "CPU" with offloading).
    """

    def __init__(self, media: Sequence[str] = ("GPU", "CPU")) -> None:
        self.directory = ResidencyDirectory()
        self._media = tuple(m.upper() for m in media)
        self._child: dict[tuple[BlockHash | None, tuple[int, ...]], BlockHash] = {}
        self._key: dict[BlockHash, tuple[BlockHash | None, tuple[int, ...]]] = {}

    def apply(self, event: KVEvent, t_s: float = 0.0) -> None:
        """Apply one KV event (in the engine's order)."""
        if isinstance(event, BlockStored) and event.token_ids:
            parent, size = event.parent_block_hash, event.block_size
            for i, h in enumerate(event.block_hashes):
                chunk = tuple(event.token_ids[i * size : (i + 1) * size])
                if len(chunk) == size:
                    self._child[(parent, chunk)] = h
                    self._key[h] = (parent, chunk)
                parent = h
        self.directory.apply(event, t_s)
        if isinstance(event, AllBlocksCleared):
            self._child.clear()
            self._key.clear()
        elif isinstance(event, BlockRemoved):  # forget blocks resident nowhere any more
            for h in event.block_hashes:
                key = self._key.get(h)
                if key is not None and not self.directory.resident(h):
                    del self._key[h]
                    if self._child.get(key) == h:
                        del self._child[key]

    def cached_prefix_tokens(self, token_ids: Sequence[int], block_size: int) -> int:
        """Tokens of the prompt's leading full blocks resident on the engine, capped at
        `len(token_ids) - 1` (an engine computes at least one token)."""
        parent: BlockHash | None = None
        n = 0
        max_blocks = (len(token_ids) - 1) // block_size
        while n < max_blocks:
            h = self._child.get((parent, tuple(token_ids[n * block_size : (n + 1) * block_size])))
            if h is None or not any(self.directory.resident(h, m) for m in self._media):
                break
            parent = h
            n += 1
        return n * block_size


class EventPrefixProbe:
    """The dispatcher's `PrefixProbe` over real engines' KV-event indexes, one per replica name.

    Args:
        indexes: replica name -> its index (fed by a `KVEventSubscriber`'s events).
        block_size: the engines' KV block size in tokens (vLLM's default 16).
    """

    def __init__(self, indexes: Mapping[str, KVEventIndex], block_size: int = 16) -> None:
        self.indexes = indexes
        self.block_size = block_size

    def __call__(self, replica: Replica, request: Request) -> int:
        index = self.indexes.get(replica.name)
        if index is None or request.prompt_token_ids is None:
            return 0
        return index.cached_prefix_tokens(request.prompt_token_ids, self.block_size)
