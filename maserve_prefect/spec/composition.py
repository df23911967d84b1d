"""The composition Γ: a tree of grammar nodes over stages.

Nodes (a discriminated union on `kind`; in YAML a bare string is shorthand for a stage node):

- `stage`: run one stage.
- `sequence`: run steps one after another.
- `choice`: branch on a field of an artifact (`on: review.verdict`), with an optional default.
- `parallel`: run branches concurrently; the `join` rule says how many must finish.
- `repeat`: run a body at most `max_iterations` times, stopping early when `until` holds.
- `handoff`: stage `source` hands control (and its history or artifacts) to stage `target`.

Γ orders stages; the dependencies D say which artifacts flow. `precedence(node)` gives the pairs
(a, b) where Γ runs a before b, so `spec.validate` can reject a D edge that Γ contradicts.

Examples:
    >>> tree = Sequence(steps=(Parallel(branches=("a", "b")), "c"))
    >>> sorted(stage_names(tree))
    ['a', 'b', 'c']
    >>> sorted(precedence(tree))
    [('a', 'c'), ('b', 'c')]
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from maserve_prefect.errors import SpecError
from maserve_prefect.spec.artifacts import NAME_PATTERN, split_field_path
from maserve_prefect.spec.base import SpecModel
from maserve_prefect.spec.rules import JoinRule

Name = Annotated[str, Field(pattern=NAME_PATTERN)]


class StageRef(SpecModel):
    """Run one stage."""

    kind: Literal["stage"] = "stage"
    stage: Name


class Sequence(SpecModel):
    """Run steps in order."""

    kind: Literal["sequence"] = "sequence"
    steps: tuple[Node, ...] = Field(min_length=1)


class Condition(SpecModel):
    """`artifact.field == equals`, evaluated on the latest version of the artifact."""

    on: str
    equals: str

    @model_validator(mode="after")
    def _path(self) -> Condition:
        split_field_path(self.on)
        return self


class Choice(SpecModel):
    """Branch on the value of an artifact field; `default` runs when no case matches."""

    kind: Literal["choice"] = "choice"
    on: str
    cases: dict[str, Node] = Field(min_length=1)
    default: Node | None = None

    @model_validator(mode="after")
    def _path(self) -> Choice:
        split_field_path(self.on)
        return self


class Parallel(SpecModel):
    """Run branches concurrently and join them by `join`."""

    kind: Literal["parallel"] = "parallel"
    branches: tuple[Node, ...] = Field(min_length=1)
    join: JoinRule = JoinRule()

    @model_validator(mode="after")
    def _join_fits(self) -> Parallel:
        self.join.check_width(len(self.branches), "branches")
        return self


class Repeat(SpecModel):
    """Run `body` up to `max_iterations` times; stop early once `until` holds."""

    kind: Literal["repeat"] = "repeat"
    body: Node
    max_iterations: int = Field(ge=1)
    until: Condition | None = None


class HandoffCarry(StrEnum):
    """What the target of a handoff receives from the source."""

    HISTORY = "history"
    ARTIFACTS = "artifacts"


class Handoff(SpecModel):
    """Stage `source` runs, then hands control to stage `target`."""

    kind: Literal["handoff"] = "handoff"
    source: Name
    target: Name
    carry: HandoffCarry = HandoffCarry.HISTORY

    @model_validator(mode="after")
    def _distinct(self) -> Handoff:
        if self.source == self.target:
            raise SpecError(f"handoff from stage {self.source!r} to itself")
        return self


def _stage_shorthand(value: Any) -> Any:
    return {"kind": "stage", "stage": value} if isinstance(value, str) else value


Node = Annotated[
    StageRef | Sequence | Choice | Parallel | Repeat | Handoff,
    Field(discriminator="kind"),
    BeforeValidator(_stage_shorthand),
]
"""A composition node. A plain string stands for `StageRef(stage=...)`."""

for _model in (Sequence, Choice, Parallel, Repeat):
    _model.model_rebuild()


def children(node: Node) -> Iterator[tuple[str, Node]]:
    """Direct children of a node with their path suffix (`.steps[1]`, `.cases['accept']`)."""
    if isinstance(node, Sequence):
        for i, step in enumerate(node.steps):
            yield f".steps[{i}]", step
    elif isinstance(node, Parallel):
        for i, branch in enumerate(node.branches):
            yield f".branches[{i}]", branch
    elif isinstance(node, Choice):
        for label, case in node.cases.items():
            yield f".cases[{label!r}]", case
        if node.default is not None:
            yield ".default", node.default
    elif isinstance(node, Repeat):
        yield ".body", node.body


def walk(node: Node, path: str = "composition") -> Iterator[tuple[str, Node]]:
    """Every node of the tree, pre-order, with its element path.

    Examples:
        >>> [p for p, _ in walk(Sequence(steps=("a", "b")))]
        ['composition', 'composition.steps[0]', 'composition.steps[1]']
    """
    yield path, node
    for suffix, child in children(node):
        yield from walk(child, path + suffix)


def stage_names(node: Node) -> set[str]:
    """Names of all stages the tree runs (handoffs count both ends)."""
    names: set[str] = set()
    for _, n in walk(node):
        if isinstance(n, StageRef):
            names.add(n.stage)
        elif isinstance(n, Handoff):
            names.update((n.source, n.target))
    return names


def precedence(node: Node) -> set[tuple[str, str]]:
    """Pairs (a, b) such that Γ finishes stage a before it starts stage b.

    Sequence steps order all stages of earlier steps before all stages of later ones; a handoff
    orders its source before its target. Parallel branches, choice cases and repeat iterations
    add no order between siblings.
    """
    pairs: set[tuple[str, str]] = set()
    for _, n in walk(node):
        if isinstance(n, Sequence):
            seen: set[str] = set()
            for step in n.steps:
                names = stage_names(step)
                pairs.update((a, b) for a in seen for b in names)
                seen |= names
        elif isinstance(n, Handoff):
            pairs.add((n.source, n.target))
    return pairs
