"""A request's live state inside the simulator, and the identity of its KV blocks.

Token bookkeeping follows vLLM v1: `num_tokens = prompt + outputs so far`; a step computes
`num_tokens - num_computed_tokens` tokens (or a chunk of them), and a step that brings
`num_computed_tokens` up to `num_tokens` samples one new token. So the step that finishes prefill
emits the first token, a decode step computes the previous token and samples the next, and a
preempted request recomputes prompt + outputs before it samples again. Outputs always run to
`max_tokens` (the simulator's length lock).

Block identity (what prefix caching matches on) is a chain: for token-id prompts, block j's hash
is `hash((hash of block j-1, token ids of block j))` taken as unsigned 64-bit, with the cache
salt folded into the root.
For prompts given as prefix-block hashes, the chain runs over the *prefix* blocks
(`C[p] = hash((C[p-1], hash id p))`, salt in the root) and engine block j, if it lies wholly inside
the shareable part, is `mix(C[last], j)` where `last` is the prefix block holding its last token:
two requests share block j exactly when their hash ids agree up to `last`. Any other block
(prompt tail past the hashed prefix, or output tokens) is unique to the request:
`mix(hash((UNIQUE, seq)), j)`, where `seq` is a per-replica admission counter. `mix` is
splitmix64 over 64-bit ints, computed in numpy for whole ranges of blocks at once; only ints and
tuples of ints are hashed, so hashes are stable across processes (string hashing is randomized
per process; salts go through blake2b). Hashes are computed once per request, lazily, for the
blocks asked for so far (`block_hash_array(n)`, a uint64 array the KV cache works on directly).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from maserve_prefect.engine.protocol import Request, Ticket

_UNIQUE = -1
_ROOT_HASH = 0x5EED
_MASK = (1 << 64) - 1
_NO_HASHES = np.zeros(0, dtype=np.uint64)  # shared empty memo; `_put` replaces it on growth


class RequestStatus(IntEnum):
    """Ordered lifecycle; `is_finished` for the terminal ones (vLLM's `RequestStatus`)."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3
    ABORTED = 4

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED


def stable_salt(salt: str | None) -> int:
    """A run-independent int for a cache salt (0 when none)."""
    if not salt:
        return 0
    return int.from_bytes(hashlib.blake2b(salt.encode(), digest_size=8).digest(), "big")


@dataclass(slots=True, eq=False)
class SimRequest:
    """Mutable per-request state the scheduler and KV manager work on."""

    request: Request
    seq: int
    arrival_s: float
    priority: int
    block_size: int
    ticket: Ticket
    realized_mode: str = "default"
    notes: tuple[str, ...] = ()
    status: RequestStatus = RequestStatus.WAITING
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1
    num_cached_cpu_tokens: int = 0  # of `num_cached_tokens`, loaded from the host KV tier
    num_preemptions: int = 0
    ordering_key: float = 0.0  # HEAR `OrderingKey`: lower first among equal priority
    protected: bool = False  # HEAR `MaxWait` ran out: ahead of every unprotected request
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    _hashes: np.ndarray = field(default_factory=lambda: _NO_HASHES)
    _num_hashes: int = 0
    _chain: np.ndarray | None = None
    _shareable_tokens: int = 0
    _salt: int = 0

    def __post_init__(self) -> None:
        req = self.request
        self.num_prompt_tokens = req.num_prompt()
        if req.prompt_token_ids is not None:
            self._shareable_tokens = self.num_prompt_tokens
        else:
            covered = len(req.prefix_block_hashes) * req.prefix_block_size
            self._shareable_tokens = min(covered, self.num_prompt_tokens)
        self._salt = stable_salt(req.cache_salt)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_tokens(self) -> int:
        """Prompt plus outputs sampled so far."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_shareable_blocks(self) -> int:
        """Blocks wholly inside the shareable prompt prefix: any later block's hash is unique to
        this request (it can be cached only by this request, i.e. after a preemption)."""
        return self._shareable_tokens // self.block_size

    @property
    def max_tokens(self) -> int:
        return self.request.max_tokens

    @property
    def num_remaining_outputs(self) -> int:
        return self.request.max_tokens - self.num_output_tokens

    def block_hash(self, j: int) -> int:
        """Hash of block j (tokens [j*bs, (j+1)*bs)); computed lazily, memoized."""
        return int(self.block_hash_array(j + 1)[j])

    def block_hashes(self, n: int) -> list[int]:
        """Block hashes 0..n-1 (at least) as a new list."""
        return self.block_hash_array(n).tolist()

    def block_hash_array(self, n: int) -> np.ndarray:
        """The memo of block hashes (uint64), holding at least blocks 0..n-1 (do not mutate)."""
        if self._num_hashes < n:
            self._extend_hashes(n)
        return self._hashes[: self._num_hashes]

    def _put(self, values: np.ndarray | list[int]) -> None:
        """Append hashes to the memo, doubling its buffer when full."""
        end = self._num_hashes + len(values)
        if end > len(self._hashes):
            grown = np.zeros(max(end, 2 * len(self._hashes), 8), dtype=np.uint64)
            grown[: self._num_hashes] = self._hashes[: self._num_hashes]
            self._hashes = grown
        self._hashes[self._num_hashes : end] = values
        self._num_hashes = end

    def _extend_hashes(self, n: int) -> None:
        bs = self.block_size
        shared_end = min(n, self._shareable_tokens // bs)  # blocks wholly inside the prefix
        start = self._num_hashes
        if start < shared_end:
            req = self.request
            if req.prompt_token_ids is not None:
                ids = req.prompt_token_ids
                parent = int(self._hashes[start - 1]) if start else hash((_ROOT_HASH, self._salt))
                chained = []
                for j in range(start, shared_end):
                    parent = hash((parent, ids[j * bs : (j + 1) * bs])) & _MASK
                    chained.append(parent)
                self._put(chained)
            else:
                chain = self._prefix_chain()
                idx = np.arange(start, shared_end, dtype=np.uint64)
                last = ((idx + np.uint64(1)) * np.uint64(bs) - np.uint64(1)) // np.uint64(
                    req.prefix_block_size
                )
                self._put(_mix(chain[last.astype(np.int64)], idx))
            start = shared_end
        if start < n:
            key = hash((_UNIQUE, self.seq)) & _MASK
            if n - start <= 4:  # a decode crossing: numpy's call overhead would dominate
                self._put([_mix_int(key, j) for j in range(start, n)])
            else:
                self._put(_mix(np.uint64(key), np.arange(start, n, dtype=np.uint64)))

    def _prefix_chain(self) -> np.ndarray:
        chain = self._chain
        if chain is None:
            vals = []
            parent = hash((_ROOT_HASH, self._salt))
            for h in self.request.prefix_block_hashes:
                parent = hash((parent, h))
                vals.append(parent & _MASK)
            chain = self._chain = np.array(vals, dtype=np.uint64)
        return chain


def _mix_int(key: int, j: int) -> int:
    """`_mix` on one pair of Python ints (same result as the numpy version)."""
    z = ((key ^ ((j * 0x9E3779B97F4A7C15) & _MASK)) + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def _mix(key: np.ndarray | np.uint64, j: np.ndarray) -> np.ndarray:
    """splitmix64 of `key ^ (j * golden)`, elementwise on uint64 (wrapping arithmetic).

    `j` is an array, so every operation is an array one: numpy wraps uint64 array arithmetic
    silently (only scalar arithmetic warns), and no `errstate` context is needed.
    """
    z = key ^ (j * _GOLDEN)
    z += _GOLDEN
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)
