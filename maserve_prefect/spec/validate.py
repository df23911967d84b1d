"""Whole-workload checks: everything that needs more than one element to decide.

`check_workload` raises the first problem as a `SpecError` whose message starts with
`workload '<name>':` and names the offending element and what to do. The order is fixed so the
same spec always reports the same problem: names, artifact references, dependency edges, cycles,
artifact provenance, selected fields, composition, memory.

Examples:
    >>> from maserve_prefect.spec.examples import example_spec
    >>> check_workload(example_spec("four_call"))  # a valid spec passes silently
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import networkx as nx

from maserve_prefect.errors import SpecError
from maserve_prefect.spec.artifacts import ArtifactInterface
from maserve_prefect.spec.composition import (
    Choice,
    Handoff,
    Node,
    Repeat,
    StageRef,
    precedence,
    walk,
)
from maserve_prefect.spec.composition import stage_names as composition_stages
from maserve_prefect.spec.memory import MemoryNamespace
from maserve_prefect.spec.stages import Stage


class DependencyLike(Protocol):
    """A stage edge as the checks read it (`workload.Dependency`)."""

    @property
    def source(self) -> str: ...

    @property
    def target(self) -> str: ...

    @property
    def artifact(self) -> str | None: ...


class WorkloadSpec(Protocol):
    """What the checks read of a workload (`workload.WorkloadSpec`, which runs them when it is
    built; a protocol, so this module does not import the model that imports it)."""

    @property
    def name(self) -> str: ...

    @property
    def artifacts(self) -> tuple[ArtifactInterface, ...]: ...

    @property
    def inputs(self) -> tuple[str, ...]: ...

    @property
    def stages(self) -> tuple[Stage, ...]: ...

    @property
    def dependencies(self) -> Sequence[DependencyLike]: ...

    @property
    def composition(self) -> Node | None: ...

    @property
    def memory(self) -> tuple[MemoryNamespace, ...]: ...

    def stage_names(self) -> list[str]: ...

    def artifact_names(self) -> list[str]: ...

    def artifact(self, name: str) -> ArtifactInterface: ...


def check_workload(spec: WorkloadSpec) -> None:
    """Raise `SpecError` for the first cross-element problem of `spec`."""
    for check in (
        _check_names,
        _check_artifact_refs,
        _check_dependencies,
        _check_acyclic,
        _check_provenance,
        _check_selected_fields,
        _check_composition,
        _check_memory,
    ):
        problem = check(spec)
        if problem is not None:
            raise SpecError(f"workload {spec.name!r}: {problem}")


def dependency_graph(spec: WorkloadSpec) -> nx.DiGraph:
    """Stages as nodes, dependencies as edges (attribute `artifacts`: the artifacts carried)."""
    graph = nx.DiGraph()
    graph.add_nodes_from(s.name for s in spec.stages)
    for dep in spec.dependencies:
        if graph.has_edge(dep.source, dep.target):
            graph.edges[dep.source, dep.target]["artifacts"].append(dep.artifact)
        else:
            graph.add_edge(dep.source, dep.target, artifacts=[dep.artifact])
    return graph


def _listing(names: Iterable[str]) -> str:
    return ", ".join(names) or "none"


def _first_duplicate(names: list[str]) -> str | None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return None


def _check_names(spec: WorkloadSpec) -> str | None:
    for what, names in (
        ("stage", [s.name for s in spec.stages]),
        ("artifact", [a.name for a in spec.artifacts]),
        ("memory namespace", [m.name for m in spec.memory]),
        ("workload input", list(spec.inputs)),
    ):
        dup = _first_duplicate(names)
        if dup is not None:
            return f"duplicate {what} name {dup!r}"
    return None


def _check_artifact_refs(spec: WorkloadSpec) -> str | None:
    declared = spec.artifact_names()
    for name in spec.inputs:
        if name not in declared:
            return f"input {name!r}: unknown artifact (declared artifacts: {_listing(declared)})"
    for stage in spec.stages:
        for what, names in (("consumes", stage.consumed()), ("produces", stage.outputs)):
            for name in names:
                if name not in declared:
                    return (
                        f"stage {stage.name!r} {what} unknown artifact {name!r} "
                        f"(declared artifacts: {_listing(declared)})"
                    )
        for ns in stage.context.memory:
            if ns not in {m.name for m in spec.memory}:
                return (
                    f"stage {stage.name!r}: context attaches unknown memory namespace {ns!r} "
                    f"(declared: {_listing(m.name for m in spec.memory)})"
                )
    return None


def _check_dependencies(spec: WorkloadSpec) -> str | None:
    stages = {s.name: s for s in spec.stages}
    for dep in spec.dependencies:
        edge = f"dependency {dep.source!r} -> {dep.target!r}"
        for end in (dep.source, dep.target):
            if end not in stages:
                return f"{edge}: unknown stage {end!r} (declared stages: {_listing(stages)})"
        if dep.artifact is None:
            continue
        if dep.artifact not in stages[dep.source].outputs:
            return (
                f"{edge}: carries {dep.artifact!r}, but stage {dep.source!r} does not produce it "
                f"(outputs: {_listing(stages[dep.source].outputs)})"
            )
        if dep.artifact not in stages[dep.target].consumed():
            return (
                f"{edge}: carries {dep.artifact!r}, but stage {dep.target!r} does not consume it "
                f"(inputs: {_listing(stages[dep.target].consumed())})"
            )
    return None


def _check_acyclic(spec: WorkloadSpec) -> str | None:
    try:
        cycle = nx.find_cycle(dependency_graph(spec))
    except nx.NetworkXNoCycle:
        return None
    path = [edge[0] for edge in cycle] + [cycle[0][0]]
    return f"dependency cycle: {' -> '.join(path)} (remove one of these dependencies)"


def _check_provenance(spec: WorkloadSpec) -> str | None:
    graph = dependency_graph(spec)
    producers: dict[str, list[str]] = {}
    for stage in spec.stages:
        for out in stage.outputs:
            producers.setdefault(out, []).append(stage.name)
    for stage in spec.stages:
        upstream = nx.ancestors(graph, stage.name)
        for artifact in stage.inputs:
            if artifact in spec.inputs or upstream & set(producers.get(artifact, ())):
                continue
            makers = producers.get(artifact, [])
            hint = (
                f"add a dependency {makers[0]!r} -> {stage.name!r}"
                if makers
                else "no stage produces it; declare it a workload input or add a producing stage"
            )
            return (
                f"stage {stage.name!r} consumes {artifact!r}, but no upstream stage produces it "
                f"(upstream: {_listing(sorted(upstream))}); {hint}"
            )
    return None


def _check_selected_fields(spec: WorkloadSpec) -> str | None:
    for stage in spec.stages:
        for artifact, fields in stage.context.fields.items():
            known = spec.artifact(artifact).field_names()
            for field in fields:
                if field not in known:
                    return (
                        f"stage {stage.name!r}: context selects field {field!r} of {artifact!r}, "
                        f"which has fields {_listing(known)}"
                    )
    return None


def _check_condition(spec: WorkloadSpec, path: str, on: str, labels: Iterable[str]) -> str | None:
    artifact, field = on.split(".", 1)
    if artifact not in spec.artifact_names():
        return f"{path}: condition on unknown artifact {artifact!r} (declared artifacts: {_listing(spec.artifact_names())})"
    interface = spec.artifact(artifact)
    if field not in interface.field_names():
        return f"{path}: artifact {artifact!r} has no field {field!r} (fields: {_listing(interface.field_names())})"
    choices = interface.field(field).choices
    for label in labels:
        if choices and label not in choices:
            return f"{path}: {on} can never be {label!r} (allowed: {_listing(choices)})"
    producers = [s.name for s in spec.stages if artifact in s.outputs]
    if not producers and artifact not in spec.inputs:
        return f"{path}: condition on {artifact!r}, which no stage produces and is not an input"
    return None


def _check_composition(spec: WorkloadSpec) -> str | None:
    if spec.composition is None:
        return None
    stages = spec.stage_names()
    for path, node in walk(spec.composition):
        refs: tuple[str, ...] = ()
        problem: str | None = None
        if isinstance(node, StageRef):
            refs = (node.stage,)
        elif isinstance(node, Handoff):
            refs = (node.source, node.target)
        elif isinstance(node, Choice):
            problem = _check_condition(spec, f"{path} (choice)", node.on, node.cases)
        elif isinstance(node, Repeat) and node.until is not None:
            problem = _check_condition(
                spec, f"{path} (repeat)", node.until.on, (node.until.equals,)
            )
        if problem is not None:
            return problem
        for ref in refs:
            if ref not in stages:
                return f"{path} ({node.kind}): unknown stage {ref!r} (declared stages: {_listing(stages)})"
    unused = [s for s in stages if s not in composition_stages(spec.composition)]
    if unused:
        return f"stage {unused[0]!r} is declared but the composition never runs it"
    order = precedence(spec.composition)
    for dep in spec.dependencies:
        if (dep.target, dep.source) in order and (dep.source, dep.target) not in order:
            return (
                f"dependency {dep.source!r} -> {dep.target!r} contradicts the composition, which "
                f"runs {dep.target!r} before {dep.source!r}"
            )
    return None


def _check_memory(spec: WorkloadSpec) -> str | None:
    roles = {role for s in spec.stages for role in s.roles()}
    for ns in spec.memory:
        for role in ns.roles():
            if role not in roles:
                return (
                    f"memory namespace {ns.name!r}: role {role!r} is not a participant of any "
                    f"stage (roles: {_listing(sorted(roles))})"
                )
    return None
