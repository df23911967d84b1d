"""The per-root environment template code submits ops through.

A `RootEnv` holds what a root's flow needs to submit ops: the workload spec, the binding and its
task instance, the deployment each role runs on, and the produced artifacts by name (as futures).
`env.call(...)` submits a `model_call` inside the right scope (root / stage instance / session /
role), so every op gets its hierarchical id and the runner sees futures as data edges. Template
code only ever *submits*; it blocks (`future.result()`) only where a control decision needs an
output — the lockstep gate makes that safe in virtual time.

Composition decisions become control edges through `Gate`s: a decision (a choice's predicate, a
repeat's until-condition, an any / k-of-n join) opens a gate on the op(s) whose results decided
it, and every op submitted while the gate is open (`env.call`, `env.submit`) that does not
already descend from them gets them as `wait_for` — CONTROL edges in the Semantic Trace. Ops that
reach a decider through their own data (or earlier control) edges get none, so the edge set is
the minimal one that orders every released op after its decision.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
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

from maserve_prefect.spec.binding import TaskBinding, TaskInstance
from maserve_prefect.spec.memory import MemoryNamespace, MemoryScope
from maserve_prefect.spec.rules import HistoryMode
from maserve_prefect.spec.stages import Stage
from maserve_prefect.spec.workload import WorkloadSpec
from maserve_prefect.taskrunner.oprun import scope
from maserve_prefect.taskrunner.opsubmit import futures_in

Future = PrefectFuture[Artifact]


class Lineage:
    """Which submitted op feeds which in one root (data and control), as its flow submitted them.

    Shared by a root's environment and its parallel branches' forks; a decision reads it to
    find the ops that already descend from the op(s) that decided.
    """

    __slots__ = ("_down", "_lock")

    def __init__(self) -> None:
        # id(upstream) → (upstream, the futures submitted with it as a dependency); the upstream
        # future is kept so its id is never reused while the root runs
        self._down: dict[int, tuple[PrefectFuture[Any], list[Future]]] = {}
        self._lock = threading.Lock()

    def add(self, upstream: Iterable[PrefectFuture[Any]], future: Future) -> None:
        """Record that `future`'s op was submitted depending on `upstream`."""
        with self._lock:
            for u in upstream:
                self._down.setdefault(id(u), (u, []))[1].append(future)

    def descendants(self, roots: Sequence[Future]) -> list[Future]:
        """`roots` and every future submitted so far that depends on one of them."""
        with self._lock:
            seen = {id(f) for f in roots}
            found = list(roots)
            stack = list(roots)
            while stack:
                entry = self._down.get(id(stack.pop()))
                for d in entry[1] if entry is not None else ():
                    if id(d) not in seen:
                        seen.add(id(d))
                        found.append(d)
                        stack.append(d)
            return found


class Gate:
    """A composition decision's hold on the ops it released.

    `deciders` are the futures of the op(s) whose results decided; the gate knows every future
    that descends from them (those submitted before it opened, from the root's `Lineage`, then
    each op submitted while it is open). An op with such a future upstream already runs after
    the decision; any other op gets the deciders as control edges.

    Examples:
        >>> g = Gate((), reached=())
        >>> g.deciders, g.covers([])
        ((), False)
    """

    __slots__ = ("_lock", "_reached", "deciders")

    def __init__(self, deciders: Sequence[Future], *, reached: Iterable[Future]) -> None:
        self.deciders: tuple[Future, ...] = tuple(deciders)
        # id → future (kept so its id is never reused while the gate is open)
        self._reached: dict[int, Future] = {id(f): f for f in (*self.deciders, *reached)}
        self._lock = threading.Lock()  # parallel branches share the gates open when they forked

    def covers(self, upstream: Iterable[PrefectFuture[Any]]) -> bool:
        """Whether an op with these upstream futures already descends from the deciders."""
        with self._lock:
            return any(id(f) in self._reached for f in upstream)

    def reach(self, future: Future) -> None:
        """Note an op submitted while the gate is open (it now runs after the decision)."""
        with self._lock:
            self._reached[id(future)] = future


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
        done_stages: stage instance ids that have run.
        gates: the open composition decisions (module docstring), oldest first.
        lineage: which op of the root feeds which (shared with the forks of parallel branches).
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
    gates: list[Gate] = field(default_factory=list)
    lineage: Lineage = field(default_factory=Lineage)

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
                self.submit(state_read, name=ns.name, persistent=ns.scope is MemoryScope.PERSISTENT)
                for ns in readable
            ]
            fut: Future = self.submit(
                model_call,
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
                wait_for=wait_for,
            )
            for ns in writable:
                self.submit(
                    state_write,
                    name=ns.name,
                    value=fut,
                    persistent=ns.scope is MemoryScope.PERSISTENT,
                )
        self.histories.setdefault(session_id, []).append(fut)
        return fut

    def submit(self, task: Any, *, wait_for: Sequence[Future] = (), **parameters: Any) -> Future:
        """Submit `task(**parameters)` in the current scope, ordered after the open decisions.

        Each open gate the op does not already descend from (through the futures in its
        parameters or `wait_for`) adds its deciders to `wait_for`; the op then reaches every
        open gate. A future in both the parameters and `wait_for` stays a data edge only.
        Template code submits every op through here (or `call`).
        """
        data = futures_in(parameters)
        upstream = [*data, *wait_for]
        # a future already passed as data is an edge already: no control edge along it too
        control = [f for f in wait_for if all(f is not d for d in data)]
        for gate in self.gates:
            if not gate.covers(upstream):
                control.extend(f for f in gate.deciders if all(f is not c for c in control))
        fut: Future = task.submit(**parameters, wait_for=control or None)
        self.lineage.add([*upstream, *control], fut)
        for gate in self.gates:
            gate.reach(fut)
        return fut

    def open_gate(self, deciders: Sequence[Future]) -> Gate | None:
        """Open a gate on `deciders` (None when no op decided: the value was an input).

        Gates the new one makes redundant — every decider already descends from them — close:
        an op ordered after the new deciders is ordered after theirs.
        """
        if not deciders:
            return None
        self.gates = [g for g in self.gates if not all(g.covers([f]) for f in deciders)]
        gate = Gate(deciders, reached=self.lineage.descendants(deciders))
        self.gates.append(gate)
        return gate

    def close_gate(self, gate: Gate | None) -> None:
        """Close `gate` (a no-op for None or a gate already closed as redundant)."""
        if gate is not None:
            self.gates = [g for g in self.gates if g is not gate]

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
