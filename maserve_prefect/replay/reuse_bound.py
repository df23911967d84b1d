"""The infinite-cache reuse bound of a trace: what fraction of its prompt tokens one server with
an unbounded prefix cache would reuse.

One idea: with no eviction and one server, a request reuses exactly the engine blocks some
earlier request cached, so walking the requests in arrival order and remembering what each
cached gives the most any pool, routing or eviction policy can reuse — a measured hit rate above
it is a bug. The walk is per *sharing unit* (prefix block, e.g. Mooncake's 512-token hash ids),
not per engine block, and follows the simulator's block identity (`engines.sim.request`):
engine block j is shareable when it lies wholly inside the prompt's hashed prefix, and its
identity is the prefix chain up to the prefix block holding its last token; so what was cached
under one chain value is a run of engine blocks from the first one ending in that prefix block,
and one integer per chain value (how far the run reaches) says it all. A hit stops at the
first engine block nobody cached, and at `num_tokens - 1` tokens (a lookup's cap: at least one
token is computed). Ops without prefix-block hashes share nothing.

Examples:
    >>> b = reuse_bound([((1, 2), 512, 1024), ((1, 2), 512, 1024), ((1, 3), 512, 700)], 16)
    >>> b.num_prompt_tokens, b.num_reusable_tokens  # 2nd: 1008 (cap), 3rd: block 1 differs
    (2748, 1520)
    >>> round(b.fraction, 4)
    0.5531
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReuseBound:
    """Prompt tokens, and of them the ones an infinite single-server cache would reuse."""

    num_prompt_tokens: int
    num_reusable_tokens: int

    @property
    def fraction(self) -> float:
        n = self.num_prompt_tokens
        return self.num_reusable_tokens / n if n else 0.0


def reuse_bound(prompts: Iterable[tuple[Sequence[int], int, int]], block_size: int) -> ReuseBound:
    """The bound over `prompts` in arrival order: `(prefix block hashes, prefix block size,
    prompt tokens)` each; `block_size` is the engine's KV block size in tokens."""
    chain_ids: dict[tuple[int, int], int] = {}  # (parent chain id, hash id) -> chain id
    reach: dict[int, int] = {}  # chain id -> end of the run of engine blocks cached under it
    total = reusable = 0
    bs = block_size
    for hashes, pbs, num_tokens in prompts:
        total += num_tokens
        if not hashes or pbs < 1:
            continue
        num_shareable = min(len(hashes) * pbs, num_tokens) // bs
        cap = (num_tokens - 1) // bs
        parent, hit, hitting = 0, 0, True
        for p, h in enumerate(hashes):
            lo = p * pbs // bs
            if lo >= num_shareable:
                break
            chain = chain_ids.setdefault((parent, h), len(chain_ids) + 1)
            parent = chain
            hi = min((p + 1) * pbs // bs, num_shareable)
            if hi <= lo:
                continue  # no engine block ends in this prefix block
            got = reach.get(chain, lo)
            if hitting:
                hit = min(got, hi)
                hitting = got >= hi
            if got < hi:
                reach[chain] = hi
        reusable += min(hit, cap) * bs
    return ReuseBound(total, reusable)
