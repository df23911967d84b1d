"""The `TaskBinding` interface: what a task supplies, kept apart from how agents collaborate.

A binding is inputs + role prompts + tools + evaluation. Its metadata (`BindingInfo`, pydantic:
it is stored in trace manifests and shown by the CLI) names the binding, where its data came
from, its instance ids, a prompt per role-prompt key and the tools it provides. The behaviour is
an abstract class: `instance(id)` returns a task instance's input artifacts, and
`evaluate(instance, answer)` scores a final answer as a `Quality`. Concrete bindings live in
`maserve_prefect.bindings`; the same workload spec runs under any binding that covers its
prompt keys, tools and inputs (`check_covers`).

Examples:
    >>> class Echo(TaskBinding):
    ...     info = BindingInfo(binding_id="echo", instance_ids=("q1",), role_prompts={"r": "Repeat."})
    ...     def instance(self, instance_id):
    ...         return TaskInstance(instance_id, {"task": {"question": instance_id}})
    ...     def evaluate(self, instance, answer):
    ...         return Quality(score=float(answer == instance.instance_id), passed=answer == instance.instance_id)
    >>> b = Echo()
    >>> b.evaluate(b.instance("q1"), "q1").passed
    True
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from pydantic import Field, model_validator

from maserve_prefect import plugins
from maserve_prefect.errors import ConfigError, SpecError
from maserve_prefect.spec.base import SpecModel
from maserve_prefect.spec.workload import WorkloadSpec


@dataclass(frozen=True, slots=True)
class QualitySummary:
    """Task quality over a run, for the run summary."""

    num_instances: int
    num_passed: int
    mean_score: float

    @property
    def pass_rate(self) -> float:
        """Fraction of instances that passed (0 when none were evaluated)."""
        return self.num_passed / self.num_instances if self.num_instances else 0.0


def summarize_quality(qualities: Iterable[Quality]) -> QualitySummary:
    """Count, passes and mean score of evaluated answers.

    Examples:
        >>> summarize_quality([Quality(1.0, True), Quality(0.5, False)]).pass_rate
        0.5
    """
    items = list(qualities)
    if not items:
        return QualitySummary(0, 0, 0.0)
    return QualitySummary(
        len(items), sum(q.passed for q in items), sum(q.score for q in items) / len(items)
    )


Answer = str | Mapping[str, Any]
"""A final answer: text, or the fields of the workload's final artifact."""


class Provenance(SpecModel):
    """Where a binding's data came from."""

    source: str = ""
    version: str = ""
    license: str = ""
    url: str = ""


class BindingInfo(SpecModel):
    """A binding's metadata.

    Attributes:
        binding_id: unique id, recorded in trace manifests.
        provenance: data source, version, license, url.
        instance_ids: ids of the task instances, in order; unique.
        role_prompts: prompt text per role-prompt key (`Participant.prompt()`).
        tools: names of the tools the binding provides.
        description: free text.
    """

    binding_id: str = Field(min_length=1)
    provenance: Provenance = Provenance()
    instance_ids: tuple[str, ...] = Field(min_length=1)
    role_prompts: dict[str, str] = Field(default_factory=dict)
    tools: tuple[str, ...] = ()
    description: str = ""

    @model_validator(mode="after")
    def _unique_ids(self) -> BindingInfo:
        seen: set[str] = set()
        for iid in self.instance_ids:
            if iid in seen:
                raise SpecError(f"binding {self.binding_id!r}: duplicate instance id {iid!r}")
            seen.add(iid)
        return self


@dataclass(frozen=True, slots=True)
class TaskInstance:
    """One task: its id and its input artifacts (artifact name → field values)."""

    instance_id: str
    inputs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Quality:
    """The evaluation of one answer: a score (higher is better), pass/fail, and a short note."""

    score: float
    passed: bool
    detail: str = ""


class TaskBinding(ABC):
    """Inputs, role prompts, tools and evaluation for one task family.

    Subclasses set `info` and implement `instance` and `evaluate`.
    """

    info: ClassVar[BindingInfo]

    @abstractmethod
    def instance(self, instance_id: str) -> TaskInstance:
        """The task instance `instance_id` (one of `info.instance_ids`)."""

    @abstractmethod
    def evaluate(self, instance: TaskInstance, answer: Answer) -> Quality:
        """Score `answer` for `instance`. Must be deterministic for the same arguments."""

    @property
    def binding_id(self) -> str:
        """The binding's id."""
        return self.info.binding_id

    def instances(self) -> Iterator[TaskInstance]:
        """Every task instance, in `info.instance_ids` order."""
        for iid in self.info.instance_ids:
            yield self.instance(iid)

    def role_prompt(self, key: str) -> str:
        """The prompt for a role-prompt key; `SpecError` listing the known keys otherwise."""
        try:
            return self.info.role_prompts[key]
        except KeyError:
            known = ", ".join(self.info.role_prompts) or "none"
            raise SpecError(
                f"binding {self.binding_id!r} has no role prompt {key!r} (prompts: {known})"
            ) from None

    def check_covers(self, spec: WorkloadSpec) -> None:
        """Raise `SpecError` unless this binding supplies every role prompt and tool `spec`
        uses and every workload input in its first instance."""
        where = f"binding {self.binding_id!r} for workload {spec.name!r}"
        for key in spec.prompt_keys():
            if key not in self.info.role_prompts:
                raise SpecError(
                    f"{where}: no role prompt {key!r} "
                    f"(binding prompts: {', '.join(self.info.role_prompts) or 'none'})"
                )
        for tool in spec.tools():
            if tool not in self.info.tools:
                raise SpecError(
                    f"{where}: no tool {tool!r} (binding tools: {', '.join(self.info.tools) or 'none'})"
                )
        first = self.instance(self.info.instance_ids[0])
        for name in spec.inputs:
            if name not in first.inputs:
                raise SpecError(
                    f"{where}: instance {first.instance_id!r} lacks input artifact {name!r} "
                    f"(has: {', '.join(first.inputs) or 'none'})"
                )


class ContentDraws(Protocol):
    """Seeded draws a native run takes its work from on the simulator (and, with
    `content_source="binding"`, on a real engine): output lengths, template decisions and
    synthetic payloads, each a pure function of (binding, run seed, root, op) and — for
    lengths and decisions, where the binding's profile responds to context — of `given`, what
    the call was given (`bindings.content.Given`: delivered tokens shift lengths and accept /
    converge odds; its prompt digest seeds every draw, spawn counts and votes included).

    `bindings.content.ContentModel` is this project's implementation; the task runner's harness
    holds one per run and the ops read it.
    """

    def output_tokens(self, role: str, *, root: str, op: str, given: Any = None) -> int: ...

    def accepts(self, round_index: int, *, root: str, op: str, given: Any = None) -> bool: ...

    def converges(self, round_index: int, *, root: str, op: str, given: Any = None) -> bool: ...

    def spawn_count(self, max_children: int, *, root: str, op: str, given: Any = None) -> int: ...

    def votes(self, num_voters: int, *, root: str, op: str, given: Any = None) -> list[int]: ...

    def answer_tokens(self, num_output_tokens: int) -> int: ...

    def payload_text(self, num_tokens: int, *, root: str, op: str) -> str: ...

    def payload_token_ids(
        self, num_tokens: int, vocab_size: int, *, root: str, op: str
    ) -> list[int]: ...


BINDINGS_GROUP = "maserve_prefect.bindings"
"""The plugin group of binding sources: each entry lists bindings and makes them by name."""


class BindingSource(Protocol):
    """A provider of task bindings (an entry of the `maserve_prefect.bindings` group)."""

    def list_bindings(self) -> list[str]: ...

    def get_binding(self, name: str) -> TaskBinding: ...


def list_bindings() -> list[str]:
    """Every installed binding's name, sorted."""
    sources: dict[str, BindingSource] = plugins.load_all(BINDINGS_GROUP)
    return sorted(n for s in sources.values() for n in s.list_bindings())


def get_binding(name: str) -> TaskBinding:
    """A new instance of the installed binding `name`.

    Raises:
        ConfigError: no installed source provides `name` (the message lists the known ones).
    """
    sources: dict[str, BindingSource] = plugins.load_all(BINDINGS_GROUP)
    for source in sources.values():
        if name in source.list_bindings():
            return source.get_binding(name)
    raise ConfigError(f"unknown binding {name!r}; known: {', '.join(list_bindings())}")
