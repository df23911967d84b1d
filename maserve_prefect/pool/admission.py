"""Admission into an engine's KV pool: the output limit, a safety margin ε_M and a back-off ρ(t).

One idea: a replica is sent only the work its KV pool can hold at once, so excess work stays in
the planner (where a new replica can still take it) instead of in an engine queue it can never
leave. The paper reserves `M_adm(t) = M_peak + ε_M + ρ(t)` per admitted request (§3.3): peak
memory on the *output limit* (never the predicted output: runtime history refines timing, not
feasibility), a margin ε_M for unmodelled variation and a back-off ρ(t) that grows after an
observed out-of-memory failure. With vLLM's pre-allocated KV that memory is KV blocks:

- a request needs `ceil((input + output limit) / block_size)` blocks; a fused chain reserves
  the largest context along it (Eq. 4's `I_c^adm + O_c^adm`) from its grant until its last
  member ends, so a chain member never finds its replica full (`committed_blocks`);
- ε_M holds back `EPSILON_M_FRAC` of the pool: vLLM's block manager keeps the same 1 %
  watermark free so that admission does not trigger immediate preemption;
- ρ(t) holds back, per deployment, the blocks of every request an engine refused for want of
  memory (`Backoff`): after a failure the same shape is admitted only with that much room more.
  The paper gives no decay, so none is applied within a run.

A replica with nothing committed still takes one request that fits its whole pool: otherwise
a request larger than the margin allows would never run.

Examples:
    >>> blocks_for(33, 16), admit_limit_blocks(1000, 0)
    (3, 990)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from maserve_prefect.pool.window import WorkUnit

EPSILON_M_FRAC = 0.01
"""ε_M as a share of a replica's KV blocks (vLLM's block-manager watermark, 1 %)."""


def blocks_for(context_tokens: int, block_size: int) -> int:
    """KV blocks a request of `context_tokens` (input + output limit) needs."""
    return math.ceil(max(context_tokens, 0) / max(block_size, 1))


def admit_limit_blocks(
    kv_blocks: int, backoff_blocks: int, eps_frac: float = EPSILON_M_FRAC
) -> int:
    """Blocks committed work may hold: the pool less ε_M and ρ(t)."""
    return max(kv_blocks - math.ceil(eps_frac * kv_blocks) - backoff_blocks, 0)


def committed_blocks(
    active: Sequence[tuple[str, int]],
    chains: Sequence[Sequence[str]],
    units: Mapping[str, WorkUnit],
    block_size: int,
) -> int:
    """Blocks a replica's committed work holds: each granted chain its largest remaining
    context (whether or not a member is in flight), each other request in flight its own.

    Args:
        active: (unit id, context tokens) of the requests in flight on the replica.
        chains: the units left of every grant standing on the replica.
        units: the DAG the chains' units come from (units it lacks reserve nothing).
    """
    granted = {uid for left in chains for uid in left}
    total = sum(blocks_for(ctx, block_size) for uid, ctx in active if uid not in granted)
    for left in chains:
        ctxs = [units[u].context_tokens for u in left if u in units]
        ctxs += [ctx for uid, ctx in active if uid in left and uid not in units]
        if ctxs:
            total += blocks_for(max(ctxs), block_size)
    return total


@dataclass(slots=True)
class Backoff:
    """ρ(t): blocks held back per deployment after observed out-of-memory refusals.

    Examples:
        >>> b = Backoff()
        >>> b.observe("m", 40, 16); b.observe("m", 8, 16); b.blocks("m"), b.blocks("x")
        (4, 0)
    """

    held: dict[str, int] = field(default_factory=dict)

    def observe(self, deployment: str, context_tokens: int, block_size: int) -> None:
        """A request of `context_tokens` was refused for want of memory."""
        self.held[deployment] = self.held.get(deployment, 0) + blocks_for(
            context_tokens, block_size
        )

    def blocks(self, deployment: str) -> int:
        return self.held.get(deployment, 0)
