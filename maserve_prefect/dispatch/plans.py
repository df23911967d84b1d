"""Plans by name: the `Plan` protocol and the registry every dispatcher looks plans up in.

One idea: a plan is a pure step function `plan(snapshot) -> Decisions` (`dispatch.snapshot`);
it never touches engines or the dispatcher's books (vLLM v1's `schedule() -> SchedulerOutput`
shape), and it is generic over the snapshot type it reads — plain plans read a `Snapshot`, pool
plans a `pool.snapshot.PoolSnapshot`. Plans are looked up by name: registering a name twice is an
error, an unknown name lists the known ones (vLLM's `create_request_queue`), and options are
passed to the plan's factory (`get_plan("sticky", order=hook)`).

This layer registers its own plans (`fcfs`; `ordered` and `sticky`, `dispatch.admission`; the
routes `least-outstanding`, `prefix` and `session`, `dispatch.routes`). The
plans of the layers above — the pool runtime's `joint` and its baselines — are declared as
entries of the `maserve_prefect.plans` plugin group (`pyproject.toml`): `get_plan` loads one the
first time its name is asked for, so this layer never imports the layers above it.

Examples:
    >>> get_plan("fcfs").name, "joint" in plan_names()
    ('fcfs', True)
    >>> get_plan("nope")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    maserve_prefect.errors.ConfigError: unknown plan 'nope'; known plans: fcfs, ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from maserve_prefect import plugins
from maserve_prefect.dispatch.admission import OrderedPlan
from maserve_prefect.dispatch.fcfs import FcfsPlan
from maserve_prefect.dispatch.routes import (
    DEFAULT_LOAD_BOUND,
    ROUTES,
    LeastOutstandingPlan,
    PrefixPlan,
    SessionPlan,
)
from maserve_prefect.dispatch.snapshot import Decisions, Snapshot
from maserve_prefect.errors import ConfigError

S_contra = TypeVar("S_contra", bound=Snapshot, contravariant=True)


class Plan(Protocol[S_contra]):
    """A named, pure planning function over snapshots of type `S_contra`."""

    name: str

    def plan(self, snapshot: S_contra) -> Decisions: ...


PlanFactory = Callable[..., Plan[Any]]
_REGISTRY: dict[str, PlanFactory] = {}
PLUGIN_GROUP = "maserve_prefect.plans"
"""Plans other packages provide (the pool runtime's among them) are entries of this plugin
group: `get_plan` loads one the first time its name is asked for (`maserve_prefect.plugins`)."""


def register_plan(name: str, factory: PlanFactory) -> None:
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


def get_plan(name: str, **options: Any) -> Plan[Any]:
    """A fresh instance of the plan registered as `name` (or declared in `PLUGIN_GROUP`).

    Raises:
        ConfigError: an unknown name, or options the plan does not take.
    """
    if name not in _REGISTRY and name in plugins.entries(PLUGIN_GROUP):
        register_plan(name, plugins.load(PLUGIN_GROUP, name))
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ConfigError(f"unknown plan {name!r}; known plans: {', '.join(plan_names())}")
    try:
        return factory(**options)
    except TypeError as exc:
        raise ConfigError(f"plan {name!r} does not take options {sorted(options)}: {exc}") from exc


def get_route(route: str, load_bound: int = DEFAULT_LOAD_BOUND) -> Plan[Any]:
    """The plan of a `--route` name (`dispatch.routes.ROUTES`); `load_bound` goes to the routes
    that take one (`prefix`, `session`).

    Raises:
        ConfigError: an unknown route, or a bad load bound.
    """
    if route not in ROUTES:
        raise ConfigError(f"unknown route {route!r}; routes: {', '.join(ROUTES)}")
    if route == "least-outstanding":
        return get_plan(route)
    return get_plan(route, load_bound=load_bound)


def plan_names() -> list[str]:
    """Registered and declared plan names, sorted."""
    return sorted(set(_REGISTRY) | set(plugins.entries(PLUGIN_GROUP)))


register_plan("fcfs", FcfsPlan)
register_plan("ordered", OrderedPlan)
register_plan("sticky", lambda **options: OrderedPlan(sticky=True, **options))
register_plan("least-outstanding", LeastOutstandingPlan)
register_plan("prefix", PrefixPlan)
register_plan("session", SessionPlan)
