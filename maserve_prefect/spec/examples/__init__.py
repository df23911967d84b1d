"""Shipped example workload specs: the four-call control and one per collaboration template.

Each example is a YAML file beside this module; `example_spec(name)` loads and validates it.

- `four_call`: two analysts in parallel → synthesis → verification (the control workload).
- `spawn`: a planner decides how many researchers to spawn, then writes the report.
- `fork_join`: five solvers in parallel, three of five must finish, a judge selects the best.
- `refinement_loop`: draft/critique rounds, then a choice on the verdict with a handoff.
- `debate`: three peers on a ring for three rounds with a judge and a shared transcript.

Examples:
    >>> example_names()
    ['debate', 'fork_join', 'four_call', 'refinement_loop', 'spawn']
    >>> example_spec("fork_join").stage("solve").control.width
    5
"""

from __future__ import annotations

from pathlib import Path

from maserve_prefect.errors import SpecError
from maserve_prefect.spec.workload import WorkloadSpec

_HERE = Path(__file__).resolve().parent


def example_names() -> list[str]:
    """Names of the shipped examples, sorted."""
    return sorted(p.stem for p in _HERE.glob("*.yaml"))


def example_path(name: str) -> Path:
    """Path of a shipped example; `SpecError` listing the examples if `name` is unknown."""
    path = _HERE / f"{name}.yaml"
    if not path.is_file():
        raise SpecError(f"unknown example spec {name!r} (available: {', '.join(example_names())})")
    return path


def example_spec(name: str) -> WorkloadSpec:
    """Load and validate a shipped example spec.

    Examples:
        >>> example_spec("four_call").topological_stages()
        ['analyst_a', 'analyst_b', 'synthesis', 'verification']
    """
    from maserve_prefect.spec.io import load_spec

    return load_spec(example_path(name))
