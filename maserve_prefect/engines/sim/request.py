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
the shareable part, is `place(C[last], j)` where `last` is the prefix block holding its last
token: two requests share block j exactly when their hash ids agree up to `last`. Any other block
(prompt tail past the hashed prefix, or output tokens) is unique to the request:
`place(hash((UNIQUE, seq)), j)`, where `seq` is a per-replica admission counter.
`place(key, j) = splitmix64(key) + j` (mod 2**64): a well-mixed base per key, and consecutive
blocks of one key get consecutive hashes, so their slots in the KV cache's hash table (the low
bits, `kv/hash_index.py`) are consecutive too and indexing a prompt touches a few cache lines per
prefix block, not one per block; keys differ in all bits, so distinct (key, j) pairs collide no
more often than random 64-bit values. Bases are computed once per prefix block, hashes for whole
ranges of blocks in numpy; only ints and tuples of ints are hashed, so hashes are stable across
processes (string hashing is randomized per process; salts go through blake2b). Hashes are
computed once per request, lazily, for the blocks asked for so far (`block_hash_array(n)`, a
uint64 array the KV cache works on directly).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import IntEnum
from itertools import accumulate

import numpy as np

from maserve_prefect.protocol.outcomes import Ticket
from maserve_prefect.protocol.requests import Request

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
    _unique_base: int = -1  # `place` base of the blocks unique to this request, once computed

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
        """Append hashes to the memo."""
        end = self._num_hashes + len(values)
        self._reserve(end)
        self._hashes[self._num_hashes : end] = values
        self._num_hashes = end

    def _reserve(self, end: int) -> None:
        """Make the memo's buffer hold at least `end` hashes, doubling it when full."""
        if end > len(self._hashes):
            # room for every block the request can fill (prompt + max_tokens) at once
            full = -(-(self.num_prompt_tokens + self.request.max_tokens) // self.block_size)
            grown = np.empty(max(end, 2 * len(self._hashes), full), dtype=np.uint64)
            grown[: self._num_hashes] = self._hashes[: self._num_hashes]
            self._hashes = grown

    def _put_placed(self, bases: np.ndarray | np.uint64, end: int) -> None:
        """Append `bases + j` for blocks j = num_hashes..end-1 (`place`), computed in the memo."""
        start = self._num_hashes
        self._reserve(end)
        np.add(bases, _block_numbers(end)[start:end], out=self._hashes[start:end])
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
                last = _last_prefix_block(bs, req.prefix_block_size, shared_end)[start:shared_end]
                self._put_placed(self.prefix_keys().take(last), shared_end)
            start = shared_end
        if start < n:
            base = self._unique_base
            if base < 0:
                base = self._unique_base = _splitmix_int(hash((_UNIQUE, self.seq)) & _MASK)
            if n - start <= 4:  # a decode crossing: numpy's call overhead would dominate
                self._put([(base + j) & _MASK for j in range(start, n)])
            else:
                self._put_placed(np.uint64(base), n)

    @property
    def has_prefix_chain(self) -> bool:
        """The prompt is given as prefix-block hashes: its shareable block hashes derive from
        the prefix chain (`prefix_keys`)."""
        return self.request.prompt_token_ids is None

    def num_blocks_within(self, num_prefix_blocks: int) -> int:
        """Engine blocks whose tokens all lie in the first `num_prefix_blocks` prefix blocks
        (block j's hash derives from chain values 0..p only when it is among the first
        `num_blocks_within(p + 1)`)."""
        return num_prefix_blocks * self.request.prefix_block_size // self.block_size

    def prefix_positions(self, start: int, end: int) -> tuple[int, int]:
        """The prefix-chain positions `[p0, p1)` that blocks `start..end-1` derive from."""
        pbs = self.request.prefix_block_size
        return start * self.block_size // pbs, (end * self.block_size - 1) // pbs + 1

    def prefix_keys(self) -> np.ndarray:
        """Each prefix block's key `splitmix64(C[p])` (uint64; `C` in the module docstring):
        the base its engine blocks' hashes count up from. splitmix64 is a bijection, so keys
        identify chain values."""
        keys = self._chain
        if keys is None:
            root = hash((_ROOT_HASH, self._salt))
            links = accumulate(self.request.prefix_block_hashes, _link, initial=root)
            next(links)  # the root itself is no prefix block's hash
            # Python's hash is a signed 64-bit int: its two's complement bits are `& _MASK`
            keys = self._chain = _splitmix(np.fromiter(links, np.int64).view(np.uint64))
        return keys


def _link(parent: int, block_hash_id: int) -> int:
    """One step of the prefix-hash chain (on the unmasked parent, as Python hashes it)."""
    return hash((parent, block_hash_id))


def _splitmix_int(key: int) -> int:
    """splitmix64's finalizer of `key` on Python ints (what `_splitmix` does per element).

    Examples:
        >>> k = 12345
        >>> _splitmix_int(k) == int(_splitmix(np.array([k], dtype=np.uint64))[0])
        True
    """
    z = (key + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def _splitmix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise and in place on the uint64 array `z` (returned).

    `z` is an array, so every operation is an array one: numpy wraps uint64 array arithmetic
    silently (only scalar arithmetic warns), and no `errstate` context is needed. The shifts go
    through one scratch array (`out=`): on a prompt's few dozen keys the calls' overhead, not
    the arithmetic, is the cost, and a fresh temporary per shift adds to it.
    """
    t = np.empty_like(z)
    np.add(z, _GOLDEN, out=z)
    np.right_shift(z, _S30, out=t)
    np.bitwise_xor(z, t, out=z)
    np.multiply(z, _M1, out=z)
    np.right_shift(z, _S27, out=t)
    np.bitwise_xor(z, t, out=z)
    np.multiply(z, _M2, out=z)
    np.right_shift(z, _S31, out=t)
    np.bitwise_xor(z, t, out=z)
    return z


# Per-position arrays every request shares (block numbers j, the prefix block holding block j's
# last token), grown by doubling: hashing a prompt slices them instead of rebuilding.
_BLOCK_NUMBERS = np.zeros(0, dtype=np.uint64)
_LAST_PREFIX_BLOCK: dict[tuple[int, int], np.ndarray] = {}


def _block_numbers(n: int) -> np.ndarray:
    """`j` as uint64 for j = 0..n-1 at least."""
    global _BLOCK_NUMBERS
    if len(_BLOCK_NUMBERS) < n:
        _BLOCK_NUMBERS = np.arange(max(n, 2 * len(_BLOCK_NUMBERS)), dtype=np.uint64)
    return _BLOCK_NUMBERS


def _last_prefix_block(block_size: int, prefix_block_size: int, n: int) -> np.ndarray:
    """For engine blocks j = 0..n-1 at least: the prefix block holding block j's last token
    (`((j + 1) * block_size - 1) // prefix_block_size`, intp)."""
    key = (block_size, prefix_block_size)
    arr = _LAST_PREFIX_BLOCK.get(key)
    if arr is None or len(arr) < n:
        size = max(n, 2 * len(arr) if arr is not None else 0)
        arr = _LAST_PREFIX_BLOCK[key] = (
            (np.arange(size, dtype=np.intp) + 1) * block_size - 1
        ) // prefix_block_size
    return arr
