"""Template configs: the control rule of a stage (who calls whom, how often, when it is done).

The four collaboration templates, plus `single` (one participant, one call) and `tool` (one
participant runs one registered tool, no model call: e.g. "run the tests") for plain stages:

- **Spawn**: a parent creates children, a fixed number or as many as it decides (bounded by
  `max_children`); children start from the parent's history or fresh, return their full output or
  a summary, and the parent resumes when the completion rule is met.
- **Fork–Join**: `width` workers run the same step concurrently (optionally each on its own
  deployment: `worker_deployments`, a heterogeneous ensemble); the sync rule says how many must
  finish; an aggregation merges their outputs (concat / vote are transforms, select_best /
  summarize are model calls of `aggregator_role`).
- **Refinement Loop**: a generator drafts, an evaluator (a model, a tool, or the binding's own
  evaluation) judges, until the accept rule holds or `max_rounds` is reached.
- **Debate**: peers answer over `rounds` rounds, seeing each other's answers along a topology
  (all-to-all, ring, star) synchronously or not; the context rule says how much history each sees.

Configs only name roles; `Stage` checks that each role is one of its participants. They form a
discriminated union on `kind`.

Examples:
    >>> ForkJoinConfig(width=3, worker_role="solver", sync={"rule": "k_of_n", "k": 2}).sync.k
    2
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, model_validator

from maserve_prefect.errors import SpecError
from maserve_prefect.spec.artifacts import NAME_PATTERN
from maserve_prefect.spec.base import SpecModel
from maserve_prefect.spec.rules import HistoryMode, JoinRule

Role = Annotated[str, Field(pattern=NAME_PATTERN)]


class SingleConfig(SpecModel):
    """One participant makes one call (the plain stage of a sequence)."""

    kind: Literal["single"] = "single"
    role: Role

    def roles(self) -> tuple[str, ...]:
        """Roles this control refers to."""
        return (self.role,)


class ToolConfig(SpecModel):
    """One participant runs one registered tool on the stage's delivered artifacts.

    `arg_from` maps a tool argument to the artifact whose text fills it; `verdict` makes the
    result carry `verdict: accept | revise` (tests passed or not), so a `Choice` or a
    `Repeat ... until` can branch on it. The participant must list the tool in its `tools`; its
    deployment is not used (a tool op takes no engine time).

    Examples:
        >>> ToolConfig(role="tester", tool="run_tests", arg_from={"code": "code"}).roles()
        ('tester',)
    """

    kind: Literal["tool"] = "tool"
    role: Role
    tool: str = Field(min_length=1)
    arg_from: dict[str, Role] = Field(default_factory=dict)
    verdict: bool = False

    def roles(self) -> tuple[str, ...]:
        """Roles this control refers to."""
        return (self.role,)


class ChildrenMode(StrEnum):
    """Whether the number of spawned children is fixed in the spec or decided by the parent."""

    FIXED = "fixed"
    DECIDED = "decided"


class ReturnMode(StrEnum):
    """What a child hands back to its parent."""

    FULL = "full"
    SUMMARY = "summary"


class SpawnConfig(SpecModel):
    """Spawn: a parent delegates to children and resumes when the completion rule holds.

    Examples:
        >>> SpawnConfig(parent_role="lead", child_role="worker", children="decided", max_children=4).bound()
        4
    """

    kind: Literal["spawn"] = "spawn"
    parent_role: Role
    child_role: Role
    children: ChildrenMode = ChildrenMode.FIXED
    num_children: int | None = Field(default=None, ge=1)
    max_children: int | None = Field(default=None, ge=1)
    child_context: HistoryMode = HistoryMode.FRESH
    return_mode: ReturnMode = ReturnMode.FULL
    completion: JoinRule = JoinRule()

    @model_validator(mode="after")
    def _bounded(self) -> SpawnConfig:
        if self.children is ChildrenMode.FIXED and self.num_children is None:
            raise SpecError("spawn with fixed children needs num_children")
        if self.children is ChildrenMode.DECIDED and self.max_children is None:
            raise SpecError(
                "spawn with children decided by the parent needs max_children (a bound)"
            )
        if self.num_children is not None and self.max_children is not None:
            if self.num_children > self.max_children:
                raise SpecError(
                    f"spawn num_children={self.num_children} exceeds max_children={self.max_children}"
                )
        self.completion.check_width(self.bound(), "children")
        return self

    def bound(self) -> int:
        """Most children this stage can have."""
        if self.children is ChildrenMode.FIXED:
            assert self.num_children is not None
            return self.num_children
        assert self.max_children is not None
        return self.max_children

    def roles(self) -> tuple[str, ...]:
        """Roles this control refers to."""
        return (self.parent_role, self.child_role)


class Aggregation(StrEnum):
    """How Fork–Join merges worker outputs."""

    CONCAT = "concat"
    VOTE = "vote"
    SELECT_BEST = "select_best"
    SUMMARIZE = "summarize"

    @property
    def needs_model(self) -> bool:
        """True when the aggregation is a model call (of the aggregator role)."""
        return self in (Aggregation.SELECT_BEST, Aggregation.SUMMARIZE)


class ForkJoinConfig(SpecModel):
    """Fork–Join: `width` concurrent workers, a sync rule and an aggregation."""

    kind: Literal["fork_join"] = "fork_join"
    worker_role: Role
    width: int = Field(ge=1)
    sync: JoinRule = JoinRule()
    aggregation: Aggregation = Aggregation.CONCAT
    aggregator_role: Role | None = None
    worker_deployments: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> ForkJoinConfig:
        self.sync.check_width(self.width, "workers (width)")
        if self.worker_deployments and len(self.worker_deployments) != self.width:
            raise SpecError(
                f"fork_join worker_deployments lists {len(self.worker_deployments)} deployments "
                f"for width {self.width}; give one per worker or leave it out"
            )
        if self.aggregation.needs_model and self.aggregator_role is None:
            raise SpecError(
                f"fork_join aggregation {self.aggregation.value!r} needs aggregator_role"
            )
        return self

    def roles(self) -> tuple[str, ...]:
        """Roles this control refers to."""
        return (self.worker_role,) + ((self.aggregator_role,) if self.aggregator_role else ())


class EvaluatorKind(StrEnum):
    """Who judges a refinement draft."""

    MODEL = "model"
    TOOL = "tool"
    BINDING = "binding"


class AcceptKind(StrEnum):
    """When a refinement draft is accepted."""

    VERDICT = "verdict"
    SCORE_AT_LEAST = "score_at_least"
    NEVER = "never"


class AcceptRule(SpecModel):
    """Accept on the evaluator's verdict, on a score threshold, or never (always run max rounds)."""

    rule: AcceptKind = AcceptKind.VERDICT
    threshold: float | None = None

    @model_validator(mode="after")
    def _threshold(self) -> AcceptRule:
        if (self.rule is AcceptKind.SCORE_AT_LEAST) != (self.threshold is not None):
            raise SpecError("accept rule: threshold is required for, and only for, score_at_least")
        return self


class RefinementLoopConfig(SpecModel):
    """Refinement Loop: draft, evaluate, revise, bounded by `max_rounds`."""

    kind: Literal["refinement_loop"] = "refinement_loop"
    generator_role: Role
    evaluator: EvaluatorKind = EvaluatorKind.MODEL
    evaluator_role: Role | None = None
    evaluator_tool: str | None = None
    accept: AcceptRule = AcceptRule()
    max_rounds: int = Field(ge=1)

    @model_validator(mode="after")
    def _evaluator_named(self) -> RefinementLoopConfig:
        if self.evaluator is EvaluatorKind.MODEL and self.evaluator_role is None:
            raise SpecError("refinement_loop with a model evaluator needs evaluator_role")
        if self.evaluator is EvaluatorKind.TOOL and not self.evaluator_tool:
            raise SpecError("refinement_loop with a tool evaluator needs evaluator_tool")
        return self

    def roles(self) -> tuple[str, ...]:
        """Roles this control refers to."""
        return (self.generator_role,) + ((self.evaluator_role,) if self.evaluator_role else ())


class Topology(StrEnum):
    """Whose answers a debate peer sees each round."""

    ALL_TO_ALL = "all_to_all"
    RING = "ring"
    STAR = "star"


class SyncMode(StrEnum):
    """Whether a debate round waits for every peer before the next starts."""

    SYNCHRONOUS = "synchronous"
    ASYNCHRONOUS = "asynchronous"


class DebateContext(StrEnum):
    """How much of the debate each peer sees: all rounds, the last round, or a summary."""

    FULL_HISTORY = "full_history"
    LAST_ROUND = "last_round"
    SUMMARY = "summary"


class DebateConfig(SpecModel):
    """Debate: peers answer over bounded rounds along a topology; an optional judge decides."""

    kind: Literal["debate"] = "debate"
    peers: tuple[Role, ...] = Field(min_length=2)
    rounds: int = Field(ge=1)
    topology: Topology = Topology.ALL_TO_ALL
    hub: Role | None = None
    sync: SyncMode = SyncMode.SYNCHRONOUS
    context: DebateContext = DebateContext.LAST_ROUND
    judge_role: Role | None = None

    @model_validator(mode="after")
    def _peers(self) -> DebateConfig:
        if len(set(self.peers)) != len(self.peers):
            raise SpecError(f"debate peers must be distinct roles, got {list(self.peers)}")
        if self.hub is not None and self.topology is not Topology.STAR:
            raise SpecError(
                f"debate hub is only meaningful for topology 'star', not {self.topology.value!r}"
            )
        if self.hub is not None and self.hub not in self.peers:
            raise SpecError(f"debate hub {self.hub!r} is not one of the peers {list(self.peers)}")
        return self

    def star_hub(self) -> str:
        """The hub of a star topology: `hub`, or the first peer."""
        return self.hub if self.hub is not None else self.peers[0]

    def roles(self) -> tuple[str, ...]:
        """Roles this control refers to."""
        return self.peers + ((self.judge_role,) if self.judge_role else ())


TemplateConfig = Annotated[
    SpawnConfig | ForkJoinConfig | RefinementLoopConfig | DebateConfig,
    Field(discriminator="kind"),
]
"""One of the four collaboration templates."""

StageControl = Annotated[
    SingleConfig | ToolConfig | SpawnConfig | ForkJoinConfig | RefinementLoopConfig | DebateConfig,
    Field(discriminator="kind"),
]
"""The control of a stage: a single call, a tool run, or one of the four templates."""
