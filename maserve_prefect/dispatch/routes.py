"""Request routes: where each ready request goes among the replicas of its deployment.

One idea: a route is a plan (`dispatch.plans`) that orders the ready units first come, first
served and differs only in *placement*. Three are registered, and `--route` names them:

- `least-outstanding`: the accepting replica with the fewest outstanding requests, ties by
  name (`fcfs.least_loaded`; the `fcfs` plan under its route name).
- `prefix`: the replica holding the longest cached prefix of the request's prompt, as KV-aware
  routers place (vLLM production stack, llm-d, Dynamo, Mooncake's conductor) — unless that
  replica's outstanding requests exceed the least-loaded one's by more than `load_bound`; then,
  and when no replica holds any of the prompt, the least-loaded replica. Ties on cached tokens go
  to the less loaded replica, then by name. What each replica holds comes from the snapshot's
  `cached_tokens`, which the dispatcher fills for plans that say `needs_prefix` by asking a
  `PrefixProbe` per (ready request, replica).
- `session`: sticky by session — a unit goes to the replica its session's (else its root's)
  first unit went to, under the same load bound; a unit with neither yet goes least-loaded.
  For traces without sessions (Mooncake: one request per root) it is `least-outstanding`.

The probe is the one effectful part, at the dispatcher's edge: `replica_prefix_probe` asks the
replica (`cached_prefix_tokens(request)`; the simulator answers from its KV cache exactly, as a
router kept current by the engine's KV events would; an engine without the method answers 0, so
`prefix` degrades to least-loaded there). For real engines, `dispatch.kv_index.EventPrefixProbe`
answers from indexes fed by the engines' KV events (`Dispatcher(..., prefix_probe=...)`).

Examples:
    >>> from maserve_prefect.protocol.state import Lifecycle
    >>> views = tuple(ReplicaView(n, "m", Lifecycle.READY, q) for n, q in (("a", 0), ("b", 3)))
    >>> u = Unit("u", "r", "m", 1000, 1)
    >>> snap = Snapshot(0.0, (u,), (), views, cached_tokens={"u": {"b": 512}})
    >>> PrefixPlan(load_bound=4).plan(snap).submits[0].replica  # b holds 512 tokens of it
    'b'
    >>> PrefixPlan(load_bound=2).plan(snap).submits[0].replica  # b is 3 ahead of a: too busy
    'a'
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping

from maserve_prefect.dispatch.fcfs import FcfsPlan, least_loaded
from maserve_prefect.dispatch.snapshot import Decisions, ReplicaView, Snapshot, Submit, Unit
from maserve_prefect.errors import ConfigError
from maserve_prefect.protocol.engine import Replica
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.views import fcfs_order

ROUTES = ("least-outstanding", "prefix", "session")
"""The route names `--route` takes (each a registered plan)."""

DEFAULT_LOAD_BOUND = 8
"""How many more outstanding requests than the least-loaded replica a cache-holding (or home)
replica may have and still get the request (the `prefix` and `session` routes)."""

PrefixProbe = Callable[[Replica, Request], int]
"""`probe(replica, request) -> prompt tokens the replica holds cached for the request now`."""


def replica_prefix_probe(replica: Replica, request: Request) -> int:
    """The replica's own answer (`cached_prefix_tokens`), or 0 when it has no such method."""
    probe = getattr(replica, "cached_prefix_tokens", None)
    return int(probe(request)) if probe is not None else 0


def _check_bound(load_bound: int) -> int:
    if not isinstance(load_bound, int) or load_bound < 0:
        raise ConfigError(f"load_bound must be an integer >= 0, got {load_bound!r}")
    return load_bound


def _within(
    target: ReplicaView | None, best: ReplicaView, load: Mapping[str, int], bound: int
) -> bool:
    """Whether `target` has room and at most `bound` more outstanding requests than `best`."""
    if target is None:
        return False
    cap = target.max_outstanding
    if cap is not None and load[target.name] >= cap:
        return False
    return load[target.name] - load[best.name] <= bound


class _RoutePlan(ABC):
    """FCFS order with a placement rule (`_pick`); subclasses say where a unit goes."""

    name = ""
    needs_prefix = False

    def plan(self, snapshot: Snapshot) -> Decisions:
        load = {r.name: r.num_outstanding for r in snapshot.replicas}
        accepting = [r for r in snapshot.replicas if r.accepting]
        # sessions this plan starts, over the snapshot's (not a copy of it: a plan per event)
        homes: dict[str, str] = {}
        submits = []
        for unit in fcfs_order(snapshot.ready, lambda u: u.ready_s, lambda u: u.unit_id):
            cands = [r for r in accepting if r.serves(unit.deployment)]
            best = least_loaded(cands, load)
            if best is None:
                continue  # nothing can take it now; it stays ready for a later event
            target = self._pick(unit, cands, best, load, snapshot, homes)
            load[target.name] += 1
            if unit.session_id and unit.session_id not in snapshot.session_homes:
                homes.setdefault(unit.session_id, target.name)
            submits.append(Submit(unit.unit_id, target.name))
        return Decisions(submits=tuple(submits))

    @abstractmethod
    def _pick(
        self,
        unit: Unit,
        cands: Iterable[ReplicaView],
        best: ReplicaView,
        load: Mapping[str, int],
        snapshot: Snapshot,
        homes: Mapping[str, str],
    ) -> ReplicaView:
        """The replica `unit` goes to, given the least-loaded one (`best`)."""


class _BoundedRoute(_RoutePlan):
    """A route that prefers one replica within `load_bound` of the least-loaded."""

    def __init__(self, load_bound: int = DEFAULT_LOAD_BOUND) -> None:
        self.load_bound = _check_bound(load_bound)


class PrefixPlan(_BoundedRoute):
    """Longest cached prefix within a load bound, else least-loaded (module docstring).

    Args:
        load_bound: the most outstanding requests the cache-holding replica may have beyond the
            least-loaded one's (>= 0).
    """

    name = "prefix"
    needs_prefix = True

    def _pick(
        self,
        unit: Unit,
        cands: Iterable[ReplicaView],
        best: ReplicaView,
        load: Mapping[str, int],
        snapshot: Snapshot,
        homes: Mapping[str, str],
    ) -> ReplicaView:
        cached = snapshot.cached_tokens.get(unit.unit_id)
        if not cached:
            return best
        top = min(cands, key=lambda r: (-cached.get(r.name, 0), load[r.name], r.name))
        if cached.get(top.name, 0) > 0 and _within(top, best, load, self.load_bound):
            return top
        return best


class SessionPlan(_BoundedRoute):
    """Sticky by session (else root) within a load bound, else least-loaded (module
    docstring).

    Args:
        load_bound: the most outstanding requests the home replica may have beyond the
            least-loaded one's (>= 0).
    """

    name = "session"

    def _pick(
        self,
        unit: Unit,
        cands: Iterable[ReplicaView],
        best: ReplicaView,
        load: Mapping[str, int],
        snapshot: Snapshot,
        homes: Mapping[str, str],
    ) -> ReplicaView:
        home = None
        if unit.session_id:
            home = snapshot.session_homes.get(unit.session_id) or homes.get(unit.session_id)
        if home is None:
            home = snapshot.homes.get(unit.root_id)
        target = next((r for r in cands if r.name == home), None)
        return (
            target if target is not None and _within(target, best, load, self.load_bound) else best
        )


class LeastOutstandingPlan(FcfsPlan):
    """`fcfs` under its route name: least outstanding requests, ties by name."""

    name = "least-outstanding"
