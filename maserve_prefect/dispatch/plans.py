"""Plans: pure `plan(snapshot) -> Decisions` functions, registered by name.

A plan sees an immutable `Snapshot` — ready and near-ready units, replica views — and returns
plain `Decisions`; it never touches engines or the dispatcher's books (vLLM v1's
`schedule() -> SchedulerOutput` shape). Registering a name twice is an error; asking for an
unknown name lists the known ones. Replay, the pool runtime and HEAR add their plans here.

The built-in `fcfs` plan: ready units in (ready time, unit id) order, each placed on the
least-loaded ready replica of its deployment (fewest outstanding requests, ties by name), with the
plan's own assignments counted as it goes.

Besides submits, `Decisions` can carry pool lifecycle decisions (`Load`, `Unload`) and `Grant`s of
fused chains; they default to empty, so plans and appliers that only know submits keep working.
The pool runtime's plans (`joint` and its baselines) and the session replay's live in their own
packages and are declared as entries of the `maserve_prefect.plans` plugin group; `get_plan`
loads one the first time its name is asked for, so this layer never imports the layers above.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from maserve_prefect import plugins
from maserve_prefect.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Unit:
    """A schedulable model call (one op), as plans see it."""

    unit_id: str
    root_id: str
    deployment: str
    num_prompt_tokens: int
    max_tokens: int
    priority: int = 0
    ready_s: float = 0.0
    workflow: str = ""


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """What a plan knows about one replica."""

    name: str
    deployment: str
    lifecycle: str
    num_running: int
    num_waiting: int
    num_outstanding: int
    kv_usage: float

    @property
    def accepting(self) -> bool:
        return self.lifecycle in ("ready", "running", "idle", "accepting")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The immutable input of a plan."""

    now_s: float
    ready: tuple[Unit, ...]
    near_ready: tuple[Unit, ...]
    replicas: tuple[ReplicaView, ...]


@dataclass(frozen=True, slots=True)
class Submit:
    """Send a ready unit to a replica now."""

    unit_id: str
    replica: str


@dataclass(frozen=True, slots=True)
class Load:
    """Start a replica of `deployment` on `device` once the named unloads have finished.

    Attributes:
        after: replicas whose `Unload` (in the same decisions) frees the memory this load needs;
            the applier starts the load when every one of them has finished unloading.
        prefetch: loaded ahead of near-ready work (no ready unit waits for it yet).
        units: the demand it serves (ready units, or near-ready units for a prefetch).
    """

    deployment: str
    device: str
    after: tuple[str, ...] = ()
    prefetch: bool = False
    units: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Unload:
    """Reclaim an idle, lease-free replica (`for_deployment`: the load it makes room for)."""

    replica: str
    for_deployment: str = ""


@dataclass(frozen=True, slots=True)
class Grant:
    """Let a unit or a fused chain run on `replica`: the head goes out as a `Submit` now, later
    members go to the same replica as soon as they are ready, and the replica stays leased (not
    reclaimable) until the last member completes."""

    replica: str
    unit_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Decisions:
    """A plan's output: never aliases the snapshot's live state.

    Appliers run unloads first, then loads (a load with `after` waits for those unloads), then
    grants and submits.
    """

    submits: tuple[Submit, ...] = ()
    loads: tuple[Load, ...] = ()
    unloads: tuple[Unload, ...] = ()
    grants: tuple[Grant, ...] = ()


class Plan(Protocol):
    """A named, pure planning function."""

    name: str

    def plan(self, snapshot: Snapshot) -> Decisions: ...


_REGISTRY: dict[str, Callable[[], Plan]] = {}
PLUGIN_GROUP = "maserve_prefect.plans"
"""Plans other packages provide (the pool runtime's among them) are entries of this plugin
group: `get_plan` loads one the first time its name is asked for (`maserve_prefect.plugins`)."""


def register_plan(name: str, factory: Callable[[], Plan]) -> None:
    """Register a plan factory under `name` (a duplicate name raises and keeps the first).

    Examples:
        >>> register_plan("fcfs", FcfsPlan)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        maserve_prefect.errors.ConfigError: a plan named 'fcfs' is already registered (FcfsPlan); ...
    """
    if name in _REGISTRY:
        first = _REGISTRY[name]
        raise ConfigError(
            f"a plan named {name!r} is already registered "
            f"({getattr(first, '__qualname__', repr(first))}); register yours under another name"
        )
    _REGISTRY[name] = factory


def get_plan(name: str) -> Plan:
    """A fresh instance of the plan registered as `name` (or declared in `PLUGIN_GROUP`)."""
    if name not in _REGISTRY and name in plugins.entries(PLUGIN_GROUP):
        register_plan(name, plugins.load(PLUGIN_GROUP, name))
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise ConfigError(
            f"unknown plan {name!r}; known plans: {', '.join(plan_names())}"
        ) from None


def plan_names() -> list[str]:
    """Registered and declared plan names, sorted."""
    return sorted(set(_REGISTRY) | set(plugins.entries(PLUGIN_GROUP)))


class FcfsPlan:
    """First come, first served with least-loaded placement (see the module docstring).

    Examples:
        >>> snap = Snapshot(0.0, (Unit("b", "r", "m", 10, 1, ready_s=1.0),
        ...                       Unit("a", "r", "m", 10, 1, ready_s=1.0)), (),
        ...                 (ReplicaView("x", "m", "ready", 0, 0, 1, 0.0),
        ...                  ReplicaView("y", "m", "ready", 0, 0, 0, 0.0)))
        >>> [(s.unit_id, s.replica) for s in FcfsPlan().plan(snap).submits]
        [('b', 'y'), ('a', 'x')]
    """

    name = "fcfs"

    def plan(self, snapshot: Snapshot) -> Decisions:
        load = {r.name: r.num_outstanding for r in snapshot.replicas}
        by_dep: dict[str, list[ReplicaView]] = {}
        for r in snapshot.replicas:
            if r.accepting:
                by_dep.setdefault(r.deployment, []).append(r)
        submits = []
        for unit in snapshot.ready:  # already in (ready_s, unit_id) order
            candidates = by_dep.get(unit.deployment)
            if not candidates:
                continue  # nothing can take it now; it stays ready for a later event
            best = min(candidates, key=lambda r: (load[r.name], r.name))
            load[best.name] += 1
            submits.append(Submit(unit.unit_id, best.name))
        return Decisions(submits=tuple(submits))


register_plan("fcfs", FcfsPlan)
