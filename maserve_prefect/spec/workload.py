"""The logical workload W = (S, D, Γ, M): stages, dependencies, composition and memory.

A `WorkloadSpec` is valid by construction: building one (in Python or through `spec.io`) runs
every element's own checks and then `spec.validate.check_workload`, and any problem surfaces as
one `SpecError` naming the element. `composition` may be omitted, in which case stages run as
soon as their dependencies finish (plain dataflow).

`inputs` names the artifacts a task binding provides (the task's question, documents, ...); every
other artifact a stage requires must be produced by one of its upstream stages in D.

Examples:
    >>> from maserve_prefect.spec.stages import Participant, Stage
    >>> from maserve_prefect.spec.templates import SingleConfig
    >>> from maserve_prefect.spec.artifacts import ArtifactField, ArtifactInterface
    >>> def art(name):
    ...     return ArtifactInterface(name=name, fields=(ArtifactField(name="text"),))
    >>> def stage(name, inputs, outputs):
    ...     who = (Participant(role="r", deployment="m"),)
    ...     ctl = SingleConfig(role="r")
    ...     return Stage(name=name, participants=who, control=ctl, inputs=inputs, outputs=outputs)
    >>> w = WorkloadSpec(
    ...     name="two",
    ...     artifacts=(art("task"), art("draft"), art("final")),
    ...     inputs=("task",),
    ...     stages=(stage("a", ("task",), ("draft",)), stage("b", ("draft",), ("final",))),
    ...     dependencies=(Dependency(source="a", target="b", artifact="draft"),),
    ... )
    >>> w.topological_stages()
    ['a', 'b']
"""

from __future__ import annotations

import networkx as nx
from pydantic import Field, model_validator

from maserve_prefect.dag import topological_order
from maserve_prefect.errors import SpecError
from maserve_prefect.spec.artifacts import NAME_PATTERN, ArtifactInterface
from maserve_prefect.spec.base import SpecModel
from maserve_prefect.spec.composition import Node
from maserve_prefect.spec.memory import MemoryNamespace
from maserve_prefect.spec.stages import Stage
from maserve_prefect.spec.validate import check_workload, dependency_graph


class Dependency(SpecModel):
    """Stage `target` waits for stage `source`; `artifact`, if named, is what the edge carries."""

    source: str = Field(pattern=NAME_PATTERN)
    target: str = Field(pattern=NAME_PATTERN)
    artifact: str | None = Field(default=None, pattern=NAME_PATTERN)


class WorkloadSpec(SpecModel):
    """W = (S, D, Γ, M) plus the artifacts they exchange.

    Attributes:
        name: workload name (used in traces and errors).
        description: free text.
        artifacts: every artifact interface the stages consume or produce.
        inputs: artifacts supplied by the task binding.
        stages: S.
        dependencies: D, the stage DAG.
        composition: Γ, the grammar tree over stages (None = run by dependencies alone).
        memory: M, logical memory namespaces.
    """

    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    artifacts: tuple[ArtifactInterface, ...] = ()
    inputs: tuple[str, ...] = ()
    stages: tuple[Stage, ...] = Field(min_length=1)
    dependencies: tuple[Dependency, ...] = ()
    composition: Node | None = None
    memory: tuple[MemoryNamespace, ...] = ()

    @model_validator(mode="after")
    def _whole(self) -> WorkloadSpec:
        check_workload(self)
        return self

    def stage_names(self) -> list[str]:
        """Stage names in declaration order."""
        return [s.name for s in self.stages]

    def artifact_names(self) -> list[str]:
        """Artifact names in declaration order."""
        return [a.name for a in self.artifacts]

    def stage(self, name: str) -> Stage:
        """The stage called `name`; `SpecError` listing the known stages otherwise."""
        for s in self.stages:
            if s.name == name:
                return s
        raise SpecError(
            f"workload {self.name!r}: unknown stage {name!r} (stages: {', '.join(self.stage_names())})"
        )

    def artifact(self, name: str) -> ArtifactInterface:
        """The artifact called `name`; `SpecError` listing the known artifacts otherwise."""
        for a in self.artifacts:
            if a.name == name:
                return a
        raise SpecError(
            f"workload {self.name!r}: unknown artifact {name!r} "
            f"(artifacts: {', '.join(self.artifact_names())})"
        )

    def graph(self) -> nx.DiGraph:
        """The dependency DAG D over stage names."""
        return dependency_graph(self)

    def topological_stages(self) -> list[str]:
        """Stage names in a deterministic topological order of D (ties by declaration order)."""
        order = {name: i for i, name in enumerate(self.stage_names())}
        edges = [(d.source, d.target) for d in self.dependencies]
        return topological_order(self.stage_names(), edges, key=order.__getitem__)

    def roles(self) -> list[str]:
        """Every participant role, first appearance order."""
        return list(dict.fromkeys(role for s in self.stages for role in s.roles()))

    def prompt_keys(self) -> list[str]:
        """Every role-prompt key a binding must provide, first appearance order."""
        return list(dict.fromkeys(p.prompt() for s in self.stages for p in s.participants))

    def tools(self) -> list[str]:
        """Every tool a participant may call, first appearance order."""
        return list(dict.fromkeys(t for s in self.stages for p in s.participants for t in p.tools))
