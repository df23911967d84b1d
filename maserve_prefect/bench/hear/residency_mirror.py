"""`ResidencyMirror`: the harness's own copy of a pool's KV residency, kept by KV events.

One idea: a policy that reads residency at every dispatch must not pay for the whole pool each
time. With 10^5 resident blocks per replica and thousands of queued turns, asking every replica
for a photograph at each dispatch made the ordering hook the whole cost of a Mooncake run (it
did not finish the 75 % load in 45 minutes). The mirror instead subscribes to each replica's
`ResidencyFeed` (the simulator's KV events; vLLM publishes the same over ZMQ) and applies only
what changed since the last dispatch, so its cost follows the work the engines did.

Merging: a block counts as resident when any replica holds it; the faster tier wins (GPU over
CPU) — the same rule as `merged_residency`, a photograph of the pool from every replica's state
report, which the tests hold the mirror to. Each
(replica, tier) keeps the set it holds, so a repeated store (a host-tier hash stored again) or a
removal of something never stored changes nothing.

Examples:
    >>> from maserve_prefect.protocol.controls import Tier
    >>> m = ResidencyMirror(block_size=16)
    >>> m.apply(0, [(Tier.GPU, True, [1, 2]), (Tier.CPU, True, [3])])
    >>> m.apply(1, [(Tier.CPU, True, [1])])
    >>> m.apply(0, [(Tier.GPU, False, [1])])
    >>> sorted((h, t.name) for h, t in m.view().tiers.items())
    [(1, 'CPU'), (2, 'GPU'), (3, 'CPU')]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING

from maserve_prefect.protocol.controls import Tier
from maserve_prefect.protocol.state import ResidencyView

if TYPE_CHECKING:
    from maserve_prefect.engines.sim.replica import SimReplica

__all__ = ["ResidencyMirror", "merged_residency"]

Change = tuple[Tier, bool | None, list[int]]


class ResidencyMirror:
    """Merged block residency of several sources, updated by their changes (module docstring).

    Args:
        block_size: tokens per block of the views it gives.
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.tiers: dict[int, Tier] = {}
        self._held: dict[tuple[int, Tier], set[int]] = {}
        self._count: dict[Tier, dict[int, int]] = {}
        self.num_changes = 0

    def apply(self, source: int, changes: Iterable[Change]) -> None:
        """Apply one source's changes, oldest first (`ResidencyFeed.drain()`)."""
        for tier, stored, hashes in changes:
            held = self._held.setdefault((source, tier), set())
            count = self._count.setdefault(tier, {})
            if stored is None:  # the tier was emptied
                hashes, stored = list(held), False
            self.num_changes += len(hashes)
            if stored:
                for h in hashes:
                    if h not in held:
                        held.add(h)
                        count[h] = count.get(h, 0) + 1
                        self._settle(h)
            else:
                for h in hashes:
                    if h in held:
                        held.remove(h)
                        left = count[h] - 1
                        if left:
                            count[h] = left
                        else:
                            del count[h]
                        self._settle(h)

    def _settle(self, h: int) -> None:
        for tier in (Tier.GPU, Tier.CPU):
            if h in self._count.get(tier, ()):
                self.tiers[h] = tier
                return
        self.tiers.pop(h, None)

    def view(self) -> ResidencyView:
        """The residency now, as a policy view for one decision. It reads the mirror's map
        without copying it, and remembers each prefix's reusable-block count (a decision asks
        about a request several times: its key, the re-check of an earlier hot ranking, and
        whether it is hot now): use it before the next `apply`, as the ordering hook does
        within one dispatch."""
        return _DecisionView(MappingProxyType(self.tiers), self.block_size)


class _DecisionView(ResidencyView):
    """A `ResidencyView` that computes each block-hash tuple's reusable prefix once."""

    __slots__ = ("_memo",)
    _memo: dict[int, tuple[Sequence[int], int]]

    def __init__(self, tiers: Mapping[int, Tier], block_size: int) -> None:
        super().__init__(tiers, block_size)
        object.__setattr__(self, "_memo", {})

    def reusable_blocks(self, block_hashes: Sequence[int]) -> int:
        memo = self._memo
        hit = memo.get(id(block_hashes))
        if hit is not None and hit[0] is block_hashes:  # the same object, kept alive here
            return hit[1]
        n = super().reusable_blocks(block_hashes)
        memo[id(block_hashes)] = (block_hashes, n)
        return n


def merged_residency(
    replicas: Sequence[SimReplica], needed: set[int] | None = None
) -> ResidencyView:
    """A photograph: one view over every replica's state report (the faster tier wins for a
    shared block) — what the mirror must equal, at a cost that grows with the pool's residency.

    With `needed`, each replica is asked about only those hashes (`SimReplica.hear_state`).
    """
    tiers: dict[int, Tier] = {}
    block_size = 16
    for rep in replicas:
        report = rep.hear_state(needed)
        block_size = report.block_size
        for rng in report.residency:
            for h in rng.block_hashes:
                old = tiers.get(h)
                if old is None or rng.tier < old:
                    tiers[h] = rng.tier
    return ResidencyView.of(tiers, block_size)
