"""A request's live state inside the simulator, and the identity of its KV blocks.

Token bookkeeping follows vLLM v1: `num_tokens = prompt + outputs so far`; a step computes
`num_tokens - num_computed_tokens` tokens (or a chunk of them), and a step that brings
`num_computed_tokens` up to `num_tokens` samples one new token. So the step that finishes prefill
emits the first token, a decode step computes the previous token and samples the next, and a
preempted request recomputes prompt + outputs before it samples again. Outputs always run to
`max_tokens` (the simulator's length lock).

Block identity (what prefix caching matches on) is a hash chain: block j's hash is
`hash((hash of block j-1, key_j))`, with the cache salt folded into block 0. The key of a block that
lies wholly inside the *shareable* part of the prompt is content-derived — the token ids for
token-id prompts; for prompts given as prefix-block hashes, `(hash id of the prefix block holding
its first token, of the one holding its last token, offset)`. Any other block (prompt tail past
the hashed prefix, or output tokens) is unique to the request: `(UNIQUE, seq, j)`, where `seq` is
a per-replica admission counter. Only tuples of ints are hashed, so hashes are stable across runs
(string hashing is randomized per process; salts go through blake2b).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import IntEnum

from maserve_prefect.engine.protocol import Request, Ticket

_UNIQUE = -1
_ROOT_HASH = 0x5EED


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
    num_preemptions: int = 0
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    _hashes: list[int] = field(default_factory=list)
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
    def max_tokens(self) -> int:
        return self.request.max_tokens

    @property
    def num_remaining_outputs(self) -> int:
        return self.request.max_tokens - self.num_output_tokens

    def block_hash(self, j: int) -> int:
        """Chained hash of block j (tokens [j*bs, (j+1)*bs)); computed lazily, memoized."""
        hashes = self._hashes
        while len(hashes) <= j:
            i = len(hashes)
            parent = hashes[-1] if hashes else hash((_ROOT_HASH, self._salt))
            hashes.append(hash((parent, self._block_key(i))))
        return hashes[j]

    def _block_key(self, j: int) -> tuple[int, ...]:
        bs = self.block_size
        start, end = j * bs, (j + 1) * bs
        req = self.request
        if end > self._shareable_tokens:
            return (_UNIQUE, self.seq, j)
        if req.prompt_token_ids is not None:
            return req.prompt_token_ids[start:end]
        pbs = req.prefix_block_size
        first = req.prefix_block_hashes[start // pbs]
        last = req.prefix_block_hashes[(end - 1) // pbs]
        return (first, last, start % pbs)
