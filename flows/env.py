"""The per-root environment template code submits ops through.

A `RootEnv` holds what a root's flow needs to submit ops: the workload spec, the binding and its
task instance, the deployment each role runs on, and the produced artifacts by name (as futures).
`env.call(...)` submits a `model_call` inside the right scope (root / stage instance / session /
role), so every op gets its hierarchical id and the runner sees futures as data edges. Template
code only ever *submits*; it blocks (`future.result()`) only where a control decision needs an
output — the lockstep gate makes that safe in virtual time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from maserve_prefect.tasks import (
    Artifact,
    ContextSpec,
    Decision,
    model_call,
    state_read,
    state_write,
)
from prefect.futures import PrefectFuture

from maserve_prefect.runtime.oprun import scope
from maserve_prefect.spec.binding import TaskBinding, TaskInstance
from maserve_prefect.spec.memory import MemoryNamespace, MemoryScope
from maserve_prefect.spec.rules import HistoryMode
from maserve_prefect.spec.stages import Stage
from maserve_prefect.spec.workload import WorkloadSpec

Future = PrefectFuture[Artifact]


@dataclass(slots=True)
class RootEnv:
    """Everything one root's flow shares (see the module docstring).

    Attributes:
        root_id: the root's id (prefix of every op id).
        workflow: the workflow name (a low-cardinality label for tags and metrics).
        spec: the workload spec the templates read their configs from.
        binding / instance: the task binding and the instance this root solves.
        deployments: spec deployment name → pool deployment name (identity when absent).
        artifacts: produced artifacts by name (futures), filled as stages run.
        histories: session id → the session's earlier outputs, in order (futures); a call with
            `history: inherited` replays them as chat turns (each output carries the user turn
            that produced it), and they are data edges of the call.
    """

    root_id: str
    workflow: str
    spec: WorkloadSpec
    binding: TaskBinding
    instance: TaskInstance
    deployments: Mapping[str, str] = field(default_factory=dict)
    artifacts: dict[str, Future | Artifact] = field(default_factory=dict)
    histories: dict[str, list[Future | Artifact]] = field(default_factory=dict)
    done_stages: set[str] = field(default_factory=set)

    # -- inputs ----------------------------------------------------------------------------

    def deployment_of(self, stage: Stage, role: str) -> str:
        for p in stage.participants:
            if p.role == role:
                return self.deployments.get(p.deployment, p.deployment)
        raise KeyError(f"stage {stage.name!r} has no participant {role!r}")

    def prompt_of(self, stage: Stage, role: str) -> str:
        for p in stage.participants:
            if p.role == role:
                return self.binding.role_prompt(p.prompt())
        return self.binding.role_prompt(role)

    def delivered(self, stage: Stage) -> list[Future | Artifact]:
        """The stage's delivered input artifacts in declaration order (futures where pending)."""
        names = stage.context.deliver if stage.context.deliver is not None else stage.inputs
        names = tuple(names) + tuple(n for n in stage.optional_inputs if n not in names)
        return [self.artifacts[n] for n in names if n in self.artifacts]

    # -- submission ------------------------------------------------------------------------

    def call(
        self,
        stage: Stage,
        role: str,
        *,
        stage_id: str,
        session: str = "",
        delivered: Sequence[Future | Artifact] = (),
        instruction: str = "",
        output: str = "output",
        decision: Decision | None = None,
        context: ContextSpec | None = None,
        iteration: int = 0,
        round: int = 0,
        template: str = "",
        wait_for: Sequence[Future] = (),
        deployment: str | None = None,
    ) -> Future:
        """Submit one model call of `role` in stage instance `stage_id`.

        The task instance reaches the model only as delivered artifacts (a stage that consumes
        `task` sees it), so the spec's context rule decides everything a call sees. `deployment`
        overrides the role's participant deployment (a heterogeneous Fork–Join worker).
        """
        session_id = session or f"{stage_id}.{role}"
        ctx = context or ContextSpec.from_rule(stage.context)
        inherited = ctx.history is HistoryMode.INHERITED
        history = list(self.histories.get(session_id, ())) if inherited else []
        readable, writable = self._memory(stage, role)
        with scope(
            stage_id=stage_id,
            stage_name=stage.name,
            template=template or stage.control.kind,
            session_id=session_id,
            role=role,
            iteration=iteration,
            round=round,
        ):
            memory: list[Future | Artifact] = [
                state_read.submit(name=ns.name, persistent=ns.scope is MemoryScope.PERSISTENT)
                for ns in readable
            ]
            fut: Future = model_call.submit(
                role=role,
                deployment=(
                    self.deployments.get(deployment, deployment)
                    if deployment is not None
                    else self.deployment_of(stage, role)
                ),
                system=self.prompt_of(stage, role),
                delivered=list(delivered) + memory,
                history=history,
                context=ctx,
                instruction=instruction,
                output=output,
                decision=decision,
                wait_for=list(wait_for) or None,
            )
            for ns in writable:
                state_write.submit(
                    name=ns.name, value=fut, persistent=ns.scope is MemoryScope.PERSISTENT
                )
        self.histories.setdefault(session_id, []).append(fut)
        return fut

    def _memory(
        self, stage: Stage, role: str
    ) -> tuple[list[MemoryNamespace], list[MemoryNamespace]]:
        """The attached namespaces `role` reads and writes in `stage` (private history is the
        session's own and needs no state op)."""
        attached = [m for m in self.spec.memory if m.name in stage.context.memory]
        shared = [m for m in attached if m.scope is not MemoryScope.PRIVATE]
        return (
            [m for m in shared if role in m.readers],
            [m for m in shared if role in m.writers],
        )

    def inherit(self, session: str, turns: list[Future | Artifact]) -> None:
        """Start `session` from `turns` (a spawned child inherits its parent's conversation)."""
        self.histories[session] = list(turns) + self.histories.get(session, [])


def resolve(value: Future | Artifact) -> Artifact:
    """The artifact behind a future (blocks through the lockstep gate) or the artifact itself."""
    return value.result() if isinstance(value, PrefectFuture) else value


def as_inputs(values: Sequence[Any]) -> list[Any]:
    """Futures and artifacts as a parameter list (futures stay futures: data edges)."""
    return list(values)
