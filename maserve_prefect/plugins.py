"""Plugins: how the library reaches code it does not import — the user folders and other packages.

One idea: the library never imports `flows/`, `tasks/`, `bindings/` or `predictors/` (nor any
package a user installs beside it); it asks an *entry-point group* for what it needs, by name.
`pyproject.toml` declares what this project ships (`[project.entry-points."maserve_prefect.*"]`);
another installed package adds its own workflows, bindings, plans or cost models by declaring
entries in the same groups, with no change here. An entry is loaded the first time it is asked
for, so importing the library stays cheap and free of import cycles.

Groups (`GROUPS`):

- `maserve_prefect.workflows`: workflow sources (`taskrunner.native.WorkflowSource`);
- `maserve_prefect.bindings`: binding sources (`spec.binding.BindingSource`);
- `maserve_prefect.plans`: dispatcher plan factories by plan name (`dispatch.plans`);
- `maserve_prefect.cost_models`: cost-model sources for pool plans (`pool.costs`).

Examples:
    >>> {"joint", "pool-fcfs"} <= set(entries("maserve_prefect.plans"))
    True
    >>> load("maserve_prefect.plans", "no-such-plan")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    maserve_prefect.errors.ConfigError: no entry 'no-such-plan' in plugin group 'maserve_prefect.plans' ...
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from maserve_prefect.errors import ConfigError

GROUPS = (
    "maserve_prefect.workflows",
    "maserve_prefect.bindings",
    "maserve_prefect.plans",
    "maserve_prefect.cost_models",
)


@cache
def entries(group: str) -> dict[str, EntryPoint]:
    """The entry points of `group` by name (read once per process).

    Raises:
        ConfigError: an unknown group, or two installed packages declare the same name.
    """
    if group not in GROUPS:
        raise ConfigError(f"unknown plugin group {group!r}; known groups: {', '.join(GROUPS)}")
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=group):
        first = found.get(ep.name)
        if first is not None and first.value != ep.value:
            raise ConfigError(
                f"plugin group {group!r}: {ep.name!r} is declared twice ({first.value} and "
                f"{ep.value}); uninstall one of the packages or rename its entry"
            )
        found[ep.name] = ep
    return found


@cache
def load(group: str, name: str) -> Any:
    """The object the entry `name` of `group` points at (imported on first use).

    Raises:
        ConfigError: no such entry (the message lists the installed ones and how to add one),
            or the entry cannot be imported.
    """
    eps = entries(group)
    ep = eps.get(name)
    if ep is None:
        have = ", ".join(sorted(eps)) or "none"
        raise ConfigError(
            f"no entry {name!r} in plugin group {group!r} (installed: {have}); is the package "
            "that provides it installed? (this project's own entries come with `pip install -e .`)"
        )
    try:
        return ep.load()
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"plugin {name!r} of group {group!r} points at {ep.value!r}, which cannot be loaded: "
            f"{exc}"
        ) from exc


def load_all(group: str) -> dict[str, Any]:
    """Every entry of `group`, loaded, by name."""
    return {name: load(group, name) for name in sorted(entries(group))}
