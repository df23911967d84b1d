"""Stages S: each stage is C_s = (participants, control, context) plus its artifact interface.

- **participants**: roles, each bound to a deployment (and optionally a model name), a role-prompt
  key looked up in the task binding (default: the role name), and the tools it may call.
- **control**: a single call or one of the four templates (`spec.templates`).
- **context**: what the stage's calls see: inherited or fresh history, which input artifacts are
  delivered (default: all), whole (`full`) or only chosen fields (`selected`), and the memory
  namespaces it attaches.

A stage declares the artifacts it consumes (`inputs`), may consume if present (`optional_inputs`:
e.g. last round's feedback inside a `Repeat`), and produces (`outputs`). Checks that need the
whole workload (artifact names, field names, namespaces) live in `spec.validate`.

Examples:
    >>> from maserve_prefect.spec.templates import SingleConfig
    >>> s = Stage(
    ...     name="synthesis",
    ...     participants=(Participant(role="writer", deployment="llama-8b"),),
    ...     control=SingleConfig(role="writer"),
    ...     inputs=("analysis_a", "analysis_b"),
    ...     outputs=("draft",),
    ... )
    >>> s.roles()
    ('writer',)
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from maserve_prefect.errors import SpecError
from maserve_prefect.spec.artifacts import NAME_PATTERN
from maserve_prefect.spec.base import SpecModel
from maserve_prefect.spec.rules import Delivery, HistoryMode
from maserve_prefect.spec.templates import StageControl, ToolConfig

Name = Annotated[str, Field(pattern=NAME_PATTERN)]


class Participant(SpecModel):
    """A role in a stage and where its calls run.

    Examples:
        >>> Participant(role="critic", deployment="qwen-7b").prompt()
        'critic'
    """

    role: Name
    deployment: str = Field(min_length=1)
    model: str = ""
    prompt_key: str | None = None
    tools: tuple[str, ...] = ()

    def prompt(self) -> str:
        """The binding's role-prompt key for this participant."""
        return self.prompt_key if self.prompt_key is not None else self.role


class ContextRule(SpecModel):
    """What a stage's calls see.

    Attributes:
        history: inherited (continue the upstream conversation) or fresh.
        deliver: input artifacts delivered into the prompt; None = all inputs.
        delivery: full artifacts, or only `fields[artifact]` of each (selected).
        fields: for selected delivery, the fields delivered per artifact.
        memory: memory namespaces the stage attaches.
    """

    history: HistoryMode = HistoryMode.FRESH
    deliver: tuple[Name, ...] | None = None
    delivery: Delivery = Delivery.FULL
    fields: dict[Name, tuple[Name, ...]] = Field(default_factory=dict)
    memory: tuple[Name, ...] = ()

    @model_validator(mode="after")
    def _selection(self) -> ContextRule:
        if self.delivery is Delivery.FULL and self.fields:
            raise SpecError("context: fields are only used with delivery 'selected'")
        if self.delivery is Delivery.SELECTED and not self.fields:
            raise SpecError("context: delivery 'selected' needs fields (artifact -> field names)")
        return self


class Stage(SpecModel):
    """One stage: participants, control, context, and the artifacts it consumes and produces."""

    name: Name
    participants: tuple[Participant, ...] = Field(min_length=1)
    control: StageControl
    context: ContextRule = ContextRule()
    inputs: tuple[Name, ...] = ()
    optional_inputs: tuple[Name, ...] = ()
    outputs: tuple[Name, ...] = Field(min_length=1)
    description: str = ""

    @model_validator(mode="after")
    def _local_consistency(self) -> Stage:
        roles = self.roles()
        for role in roles:
            if roles.count(role) > 1:
                raise SpecError(f"stage {self.name!r}: participant role {role!r} appears twice")
        for role in self.control.roles():
            if role not in roles:
                raise SpecError(
                    f"stage {self.name!r}: control {self.control.kind} names role {role!r}, which "
                    f"is not a participant (participants: {', '.join(roles)})"
                )
        if isinstance(self.control, ToolConfig):
            runner = next(p for p in self.participants if p.role == self.control.role)
            if self.control.tool not in runner.tools:
                raise SpecError(
                    f"stage {self.name!r}: tool control runs {self.control.tool!r}, but participant "
                    f"{runner.role!r} does not list it in tools ({', '.join(runner.tools) or 'none'})"
                )
        _no_repeats(self.name, "inputs", self.inputs + self.optional_inputs)
        _no_repeats(self.name, "outputs", self.outputs)
        consumed = self.consumed()
        for artifact in self.context.deliver or ():
            if artifact not in consumed:
                raise SpecError(
                    f"stage {self.name!r}: context delivers {artifact!r}, which is not one of its "
                    f"inputs ({', '.join(consumed) or 'none'})"
                )
        for artifact in self.context.fields:
            if artifact not in consumed:
                raise SpecError(
                    f"stage {self.name!r}: context selects fields of {artifact!r}, which is not one "
                    f"of its inputs ({', '.join(consumed) or 'none'})"
                )
        return self

    def roles(self) -> tuple[str, ...]:
        """Participant roles in declaration order."""
        return tuple(p.role for p in self.participants)

    def consumed(self) -> tuple[str, ...]:
        """Required and optional input artifacts."""
        return self.inputs + self.optional_inputs

    def delivered(self) -> tuple[str, ...]:
        """Input artifacts delivered into the stage's prompts."""
        return self.context.deliver if self.context.deliver is not None else self.consumed()


def _no_repeats(stage: str, what: str, names: tuple[str, ...]) -> None:
    for name in names:
        if names.count(name) > 1:
            raise SpecError(f"stage {stage!r}: artifact {name!r} is listed twice in {what}")
