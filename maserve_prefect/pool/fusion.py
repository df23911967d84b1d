"""Fusion: consecutive calls of one deployment run as one chain, and demand is coalesced.

One idea: a plan never reasons about single calls in isolation. Consecutive calls of one
deployment with nothing branching or joining between them form a *chain* that runs under one
grant (one placement, one lease) with an *envelope* — its largest context and its summed
runtime; and demand for a deployment from many workflows is *coalesced* into one lifecycle
action (one load serves every root; request state stays per root). How a replica for that
demand is found is `constructor`.

Fusion rule: `u → v` fuse iff `u`'s only successor is `v`, `v`'s only predecessor is `u`, both
belong to the same root and name the same deployment (identity = model + version + serving
config, so "same name" is "compatible config"). Fusion never crosses a branch or a join, and
every unit of a chain stays its own request with its own output and completion.

Examples:
    >>> a = WorkUnit("a", "r", "m", 10, 5, succs=("b",))
    >>> b = WorkUnit("b", "r", "m", 20, 5, preds=("a",))
    >>> chains = fusible_chains({"a": a, "b": b})
    >>> chains["b"].unit_ids, envelope([a, b]).max_context_tokens
    (('a', 'b'), 25)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from maserve_prefect.pool.state import CostModel
from maserve_prefect.pool.window import WorkUnit, topo_order


@dataclass(frozen=True, slots=True)
class Chain:
    """A maximal fusible chain of units (head first)."""

    chain_id: str
    root_id: str
    deployment: str
    unit_ids: tuple[str, ...]

    def rest(self, unit_id: str) -> tuple[str, ...]:
        """`unit_id` and the chain members after it."""
        return self.unit_ids[self.unit_ids.index(unit_id) :]


def fusible(u: WorkUnit, v: WorkUnit) -> bool:
    """Whether `v` may run under `u`'s grant (module docstring)."""
    return (
        u.succs == (v.unit_id,)
        and v.preds == (u.unit_id,)
        and u.root_id == v.root_id
        and u.deployment == v.deployment
    )


def fusible_chains(units: Mapping[str, WorkUnit], enabled: bool = True) -> dict[str, Chain]:
    """Every unit's maximal chain (a singleton when fusion is off or nothing fuses).

    Raises:
        ConfigError: the DAG is malformed (see `window.topo_order`).
    """
    out: dict[str, Chain] = {}
    for uid in topo_order(units):
        if uid in out:
            continue
        members = [uid]
        while enabled:
            u = units[members[-1]]
            if len(u.succs) != 1 or not fusible(u, units[u.succs[0]]):
                break
            members.append(u.succs[0])
        head = units[uid]
        chain = Chain(uid, head.root_id, head.deployment, tuple(members))
        for m in members:
            out[m] = chain
    return out


@dataclass(frozen=True, slots=True)
class Envelope:
    """What a replica must admit to run a chain: its largest context and its length."""

    max_context_tokens: int
    max_input_len: int
    max_output_len: int
    num_units: int


def envelope(units: Sequence[WorkUnit]) -> Envelope:
    """The admission envelope of units that run one after another on one replica."""
    return Envelope(
        max(u.context_tokens for u in units),
        max(u.input_len for u in units),
        max(u.max_tokens for u in units),
        len(units),
    )


@dataclass(frozen=True, slots=True)
class WorkItem:
    """A placeable piece of ready work: a unit and the rest of its fused chain.

    Attributes:
        units: head first; all share the head's deployment.
        release_s: when the head became ready (or is predicted to, for near-ready work).
    """

    units: tuple[WorkUnit, ...]
    release_s: float

    @property
    def head(self) -> WorkUnit:
        return self.units[0]

    @property
    def deployment(self) -> str:
        return self.units[0].deployment

    @property
    def unit_ids(self) -> tuple[str, ...]:
        return tuple(u.unit_id for u in self.units)

    @property
    def envelope(self) -> Envelope:
        return envelope(self.units)

    def runtime_s(self, costs: CostModel, model: str, gpu: str, batch: int = 1) -> float:
        """Summed predicted runtime of the chain on `gpu` (members run one after another),
        each timed on its `timing_output` (`pool.outputs`)."""
        return sum(
            costs.runtime_s(model, gpu, batch, u.input_len, u.timing_output) for u in self.units
        )


def work_item(
    unit: WorkUnit,
    release_s: float,
    units: Mapping[str, WorkUnit],
    chains: Mapping[str, Chain] | None,
) -> WorkItem:
    """The work item headed by `unit`: its chain from `unit` on (just `unit` without chains)."""
    chain = chains.get(unit.unit_id) if chains else None
    ids = chain.rest(unit.unit_id) if chain else (unit.unit_id,)
    return WorkItem((unit, *(units[i] for i in ids[1:])), release_s)


@dataclass(frozen=True, slots=True)
class Demand:
    """Coalesced demand for one deployment: the work items of every root that need it."""

    deployment: str
    items: tuple[WorkItem, ...]

    @property
    def roots(self) -> tuple[str, ...]:
        return tuple(sorted({i.head.root_id for i in self.items}))


def coalesce(items: Iterable[WorkItem]) -> list[Demand]:
    """Group work items by deployment (one lifecycle action can serve them all), deployment
    order, items kept in their given order.

    Examples:
        >>> a, b = WorkUnit("a", "r1", "m", 1, 1), WorkUnit("b", "r2", "m", 1, 1)
        >>> [d.roots for d in coalesce([WorkItem((a,), 0.0), WorkItem((b,), 0.0)])]
        [('r1', 'r2')]
    """
    groups: dict[str, list[WorkItem]] = {}
    for item in items:
        groups.setdefault(item.deployment, []).append(item)
    return [Demand(d, tuple(groups[d])) for d in sorted(groups)]
