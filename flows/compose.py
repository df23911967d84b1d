"""The composition grammar as execution: sequence, choice, parallel + join, repeat, handoff.

`run_node(env, node)` walks a spec's composition tree. Stages run through their templates;
parallel branches run on their own gate-counted threads (a blocking template in one branch never
holds up another) and the join rule picks which branches' outputs flow on; `Choice` and
`Repeat ... until` block on the artifact field they test — the only places a composition waits.
Repeated stages get instance ids `name#i`, so every iteration is its own stage instance.

Every decision orders the ops it released after the op(s) whose results decided it (control
edges, through the environment's gates; see `flows.env`): a choice's branch after the op its
predicate read; a repeat's next iteration after the op its until-condition read, and once the
condition holds, everything after the repeat; after an any / k-of-n join, everything that follows
after the branch outputs that completed the join. A repeat that runs out of iterations and an
`all` join decide nothing.

Without a composition, stages run by their dependencies: level by level in topological order,
stages of one level in parallel.
"""

from __future__ import annotations

from collections.abc import Callable

import networkx as nx
from maserve_prefect.flows.concurrency import first_k, run_branches
from maserve_prefect.flows.env import Future, RootEnv, resolve
from maserve_prefect.flows.templates import run_stage
from maserve_prefect.tasks import Artifact

from maserve_prefect.spec.composition import (
    Choice,
    Condition,
    Handoff,
    HandoffCarry,
    Node,
    Parallel,
    Repeat,
    Sequence,
    StageRef,
)
from maserve_prefect.spec.rules import HistoryMode


def _stage_id(name: str, iteration: int) -> str:
    return f"{name}#{iteration}" if iteration else name


def _read(env: RootEnv, path: str) -> tuple[object, tuple[Future, ...]]:
    """The value at `artifact.field` and the future of the op that produced it (none for an
    input artifact or one not produced yet)."""
    art_name, _, field = path.partition(".")
    value = env.artifacts.get(art_name)
    if value is None:
        return None, ()
    deciders: tuple[Future, ...] = () if isinstance(value, Artifact) else (value,)
    return resolve(value).field(field), deciders


def _holds(env: RootEnv, cond: Condition) -> tuple[bool, tuple[Future, ...]]:
    value, deciders = _read(env, cond.on)
    return str(value) == cond.equals, deciders


def run_node(env: RootEnv, node: Node, iteration: int = 0) -> None:
    """Execute one composition node (see the module docstring)."""
    if isinstance(node, StageRef):
        run_stage(env, env.spec.stage(node.stage), _stage_id(node.stage, iteration), iteration)
    elif isinstance(node, Sequence):
        for step in node.steps:
            run_node(env, step, iteration)
    elif isinstance(node, Choice):
        value, deciders = _read(env, node.on)
        chosen = node.cases.get(str(value), node.default)
        if chosen is not None:
            gate = env.open_gate(deciders)
            run_node(env, chosen, iteration)
            env.close_gate(gate)
    elif isinstance(node, Parallel):
        _run_parallel(env, node, iteration)
    elif isinstance(node, Repeat):
        _run_repeat(env, node, iteration)
    elif isinstance(node, Handoff):
        source = env.spec.stage(node.source)
        if _stage_id(node.source, iteration) not in env.done_stages:
            run_stage(env, source, _stage_id(node.source, iteration), iteration)
        target = env.spec.stage(node.target)
        if node.carry is HandoffCarry.HISTORY and target.context.history is HistoryMode.INHERITED:
            # The target continues the source's conversation: its longest session's turns.
            prefix = f"{_stage_id(node.source, iteration)}."
            sessions = sorted(
                (k for k in env.histories if k.startswith(prefix)),
                key=lambda k: (-len(env.histories[k]), k),
            )
            turns = env.histories[sessions[0]] if sessions else []
            for role in target.roles():
                env.inherit(f"{_stage_id(node.target, iteration)}.{role}", turns)
        run_stage(env, target, _stage_id(node.target, iteration), iteration)
    else:  # pragma: no cover - the spec's union is closed
        raise TypeError(f"unknown composition node {node!r}")


def _run_repeat(env: RootEnv, node: Repeat, iteration: int) -> None:
    """The body up to `max_iterations` times; each iteration after the first is gated on the
    op the until-condition read, and once it holds the rest of the root is."""
    previous: tuple[Future, ...] = ()
    for i in range(node.max_iterations):
        gate = env.open_gate(previous)
        run_node(env, node.body, iteration * node.max_iterations + i)
        env.close_gate(gate)
        if node.until is None:
            continue
        held, previous = _holds(env, node.until)
        if held:
            env.open_gate(previous)  # closed with the root: everything after the repeat
            break


def _run_parallel(env: RootEnv, node: Parallel, iteration: int) -> None:
    before = dict(env.artifacts)
    branch_envs = [_fork(env) for _ in node.branches]
    fns: list[Callable[[], None]] = [
        (lambda e=e, b=b: run_node(e, b, iteration))  # type: ignore[misc]
        for e, b in zip(branch_envs, node.branches, strict=True)
    ]
    run_branches(fns)
    produced = [
        {k: v for k, v in e.artifacts.items() if before.get(k) is not v} for e in branch_envs
    ]
    need = node.join.required(len(node.branches))
    if need < len(node.branches):
        finals: list[Future] = []
        index: list[int] = []
        for i, outs in enumerate(produced):
            futs = [v for v in outs.values() if not isinstance(v, Artifact)]
            if futs:
                finals.append(futs[-1])
                index.append(i)
        firsts = first_k(finals, min(need, len(finals))) if finals else []
        keep = {index[i] for i in firsts}
        produced = [p if i in keep else {} for i, p in enumerate(produced)]
        # closed with the root: everything after the join waits for the outputs that made it
        env.open_gate([finals[i] for i in sorted(firsts)])
    for e, outs in zip(branch_envs, produced, strict=True):
        env.artifacts.update(outs)
        env.histories.update(e.histories)
        env.done_stages |= e.done_stages


def _fork(env: RootEnv) -> RootEnv:
    return RootEnv(
        root_id=env.root_id,
        workflow=env.workflow,
        spec=env.spec,
        binding=env.binding,
        instance=env.instance,
        deployments=env.deployments,
        artifacts=dict(env.artifacts),
        histories={k: list(v) for k, v in env.histories.items()},
        done_stages=set(env.done_stages),
        gates=list(env.gates),
        lineage=env.lineage,
    )


def run_by_dependencies(env: RootEnv) -> None:
    """Run every stage in topological levels (stages of a level in parallel)."""
    g = env.spec.graph()
    for level in nx.topological_generations(g):
        names = sorted(level)
        branch_envs = [_fork(env) for _ in names]
        run_branches(
            [
                (lambda e=e, n=n: run_stage(e, env.spec.stage(n), n, 0))
                for e, n in zip(branch_envs, names, strict=True)
            ]
        )
        for e in branch_envs:
            env.artifacts.update(e.artifacts)
            env.histories.update(e.histories)
            env.done_stages |= e.done_stages


def run_workload(env: RootEnv) -> None:
    """Run the spec's composition, or its dependency graph when it has none."""
    if env.spec.composition is None:
        run_by_dependencies(env)
    else:
        run_node(env, env.spec.composition)
