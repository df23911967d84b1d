"""Native runs as the library sees them: what a run returns, and how to start one by name.

One idea: a *native run* realizes roots of a workflow through Prefect flows on an engine, and the
workflows themselves live in a user folder (`flows/`: templates, composition, the workflow
index) — which the library never imports. It asks the `maserve_prefect.workflows` plugin group
instead (`plugins`): each entry is a `WorkflowSource` that lists its workflows and runs them. The
CLI, the demo, replay scenarios and the pool suite all start native runs through `run_native`
here; this project's own source is `maserve_prefect.flows.source`.

Examples:
    >>> "fork_join" in list_workflows()
    True
    >>> get_workflow("code_repair").default_binding
    'code'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from maserve_prefect import plugins
from maserve_prefect.errors import ConfigError
from maserve_prefect.spec.binding import Quality
from maserve_prefect.spec.workload import WorkloadSpec
from maserve_prefect.trace.model import Trace

if TYPE_CHECKING:
    from maserve_prefect.engines.sim.pool.sim_pool import SimPool
    from maserve_prefect.taskrunner.harness import Harness

GROUP = "maserve_prefect.workflows"


@dataclass(slots=True)
class RootResult:
    """One root's outcome."""

    root_id: str
    instance_id: str
    arrival_s: float
    finish_s: float
    quality: Quality | None
    error: str | None = None
    raised_at: str | None = None
    """Where a failed root's exception was raised: its innermost frames, innermost first
    (`file:line function`; `raised_at`), for an error that names no op (e.g. a Prefect API
    call that timed out)."""


def raised_at(exc: BaseException, frames: int = 3) -> str:
    """The innermost `frames` frames of `exc`'s traceback, innermost first, short paths.

    Examples:
        >>> def inner() -> None:
        ...     raise ValueError("x")
        >>> try:
        ...     inner()
        ... except ValueError as e:
        ...     raised_at(e, 1)
        '<doctest maserve_prefect.taskrunner.native.raised_at[0]>:2 inner'
    """
    import traceback

    found = traceback.extract_tb(exc.__traceback__)[-frames:]
    parts = []
    for f in reversed(found):
        path = f.filename
        for marker in ("site-packages/", "maserve_prefect/", "flows/", "tasks/"):
            if marker in path:
                path = marker.rstrip("/") + "/" + path.split(marker, 1)[1]
                if marker == "site-packages/":
                    path = path.removeprefix("site-packages/")
                break
        parts.append(f"{path}:{f.lineno} {f.name}")
    return " <- ".join(parts)


@dataclass(slots=True)
class NativeRun:
    """What a native run produced."""

    trace: Trace
    roots: list[RootResult]
    pool: SimPool | None
    harness: Harness
    flow_run_ids: list[str] = field(default_factory=list)
    meaningful_quality: bool = False
    cancelled: bool = False
    """The run was cancelled (`run_native(cancel=...)`): the trace holds what finished."""
    parent_flow_run_id: str | None = None
    """The run's parent flow run (`maserve-run`), whose subflows are the roots' flow runs."""


class WorkflowInfo(Protocol):
    """What the library reads of a workflow: its name, spec and default binding."""

    @property
    def name(self) -> str: ...

    @property
    def spec(self) -> WorkloadSpec: ...

    @property
    def default_binding(self) -> str: ...

    @property
    def description(self) -> str: ...


class WorkflowSource(Protocol):
    """A provider of runnable workflows (an entry of the `maserve_prefect.workflows` group)."""

    def list_workflows(self) -> list[str]: ...

    def get_workflow(self, name: str) -> WorkflowInfo: ...

    def run_native(self, workflow: Any, binding: Any = None, **options: Any) -> NativeRun: ...


def _sources() -> dict[str, WorkflowSource]:
    sources: dict[str, WorkflowSource] = plugins.load_all(GROUP)
    if not sources:
        raise ConfigError(
            f"no workflow source is installed (plugin group {GROUP!r}); install maserve-prefect "
            "with its user folders (`pip install -e .`)"
        )
    return sources


def _source_of(name: str) -> WorkflowSource:
    found = [s for s in _sources().values() if name in s.list_workflows()]
    if not found:
        raise ConfigError(f"unknown workflow {name!r}; known: {', '.join(list_workflows())}")
    return found[0]


def list_workflows() -> list[str]:
    """Every installed workflow's name, sorted (names are unique across sources)."""
    names: list[str] = []
    for source_name, source in _sources().items():
        for name in source.list_workflows():
            if name in names:
                raise ConfigError(
                    f"workflow {name!r} is provided twice (again by source {source_name!r}); "
                    "rename one"
                )
            names.append(name)
    return sorted(names)


def get_workflow(name: str) -> WorkflowInfo:
    """The workflow `name` from the source that provides it."""
    return _source_of(name).get_workflow(name)


def run_native(workflow: str | WorkflowInfo, binding: Any = None, **options: Any) -> NativeRun:
    """Realize roots of `workflow` natively (`flows.native.run_native` documents the options).

    Raises:
        ConfigError: no source provides `workflow`, or the source refused the options.
    """
    name = workflow if isinstance(workflow, str) else workflow.name
    return _source_of(name).run_native(workflow, binding, **options)
