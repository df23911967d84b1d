"""The four collaboration templates (and the single-call stage) as op-submitting stage functions.

Each `run_<template>(env, stage, stage_id)` (and `run_single` / `run_tool` for plain stages) submits the stage's ops eagerly (futures as
parameters, so the runner sees the graph ahead of readiness) and blocks only where the template's
rule needs an output: a refinement verdict, a debate convergence check, a spawn count, an
any / k-of-n join. It returns the stage's output artifacts by name (futures or artifacts).

- Spawn: parent plans → children (fixed, or as many as the parent decides, bounded) with inherited
  or fresh context → completion rule → parent resumes with the children's full or summarized
  returns.
- Fork–Join: `width` workers → sync rule (all / any / k-of-n) → aggregation (concat / vote as
  transforms, select_best / summarize as a call of the aggregator role).
- Refinement Loop: draft → evaluate (model, tool, or the binding's evaluation) → until accepted
  or `max_rounds`; each round's feedback goes into the next draft.
- Debate: peers answer over rounds, each revising its own previous answer (self-revision) in
  the light of the peers' answers it sees along the topology (all-to-all, ring, star), the last
  round or the whole history. A synchronous debate has a per-round barrier: no peer starts round
  r before every peer finished round r - 1 (control edges where a peer does not see a previous
  answer by data), and may stop early when the convergence check says so; an asynchronous one
  lets a peer go on as soon as the answers it reads are in. An optional judge decides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from maserve_prefect.flows.concurrency import first_k
from maserve_prefect.flows.env import Future, RootEnv, resolve
from maserve_prefect.tasks import Artifact, ContextSpec, Decision, tool_call, transform

from maserve_prefect.spec.rules import Delivery, HistoryMode
from maserve_prefect.spec.stages import Stage
from maserve_prefect.spec.templates import (
    AcceptKind,
    Aggregation,
    ChildrenMode,
    DebateConfig,
    DebateContext,
    EvaluatorKind,
    ForkJoinConfig,
    RefinementLoopConfig,
    ReturnMode,
    SingleConfig,
    SpawnConfig,
    SyncMode,
    ToolConfig,
    Topology,
)
from maserve_prefect.taskrunner.oprun import scope

Outputs = dict[str, Future | Artifact]


def _outputs(stage: Stage, final: Future | Artifact) -> Outputs:
    return dict.fromkeys(stage.outputs, final)


def run_single(env: RootEnv, stage: Stage, stage_id: str, iteration: int = 0) -> Outputs:
    cfg = stage.control
    assert isinstance(cfg, SingleConfig)
    out = env.call(
        stage, cfg.role, stage_id=stage_id, delivered=env.delivered(stage),
        output=stage.outputs[0], iteration=iteration,
    )  # fmt: skip
    return _outputs(stage, out)


def run_tool(env: RootEnv, stage: Stage, stage_id: str, iteration: int = 0) -> Outputs:
    """A tool stage: one `tool_call` on the delivered artifacts; with `verdict`, the result
    says accept / revise (on the simulator drawn per 1-based iteration, like a refinement round).
    """
    cfg = stage.control
    assert isinstance(cfg, ToolConfig)
    with scope(stage_id=stage_id, stage_name=stage.name, template="tool",
               session_id=f"{stage_id}.{cfg.role}", role=cfg.role, iteration=iteration):  # fmt: skip
        out = env.submit(
            tool_call, tool=cfg.tool, args=_tool_args(env, cfg.tool), inputs=env.delivered(stage),
            arg_from=cfg.arg_from or _tool_arg_from(cfg.tool), output=stage.outputs[0],
            decision=Decision("accept", round=iteration + 1) if cfg.verdict else None,
        )  # fmt: skip
    return _outputs(stage, out)


def run_fork_join(env: RootEnv, stage: Stage, stage_id: str, iteration: int = 0) -> Outputs:
    cfg = stage.control
    assert isinstance(cfg, ForkJoinConfig)
    inputs = env.delivered(stage)
    workers = [
        env.call(
            stage,
            cfg.worker_role,
            stage_id=stage_id,
            session=f"{stage_id}.worker{i}",
            delivered=inputs,
            output="contribution",
            iteration=iteration,
            template="fork_join",
            deployment=cfg.worker_deployments[i] if cfg.worker_deployments else None,
            decision=Decision("vote", limit=cfg.width, index=i, group=stage_id)
            if cfg.aggregation is Aggregation.VOTE
            else None,
        )
        for i in range(cfg.width)
    ]
    need = cfg.sync.required(cfg.width)
    chosen = workers if need == cfg.width else [workers[i] for i in first_k(workers, need)]
    name = stage.outputs[0]
    if cfg.aggregation.needs_model:
        assert cfg.aggregator_role is not None
        final: Future | Artifact = env.call(
            stage, cfg.aggregator_role, stage_id=stage_id, delivered=chosen, output=name,
            iteration=iteration, instruction=f"{cfg.aggregation.value} the contributions",
        )  # fmt: skip
    else:
        fn = "majority_vote" if cfg.aggregation is Aggregation.VOTE else "concat"
        with scope(stage_id=stage_id, stage_name=stage.name, session_id=f"{stage_id}.join"):
            final = env.submit(transform, fn=fn, inputs=chosen, arg="answer", output=name)
    return _outputs(stage, final)


def _evaluate(
    env: RootEnv, stage: Stage, cfg: RefinementLoopConfig, stage_id: str, draft: Future, r: int,
    iteration: int,
) -> Future:  # fmt: skip
    decision = Decision("accept", round=r)
    if cfg.evaluator is EvaluatorKind.MODEL:
        assert cfg.evaluator_role is not None
        return env.call(
            stage, cfg.evaluator_role, stage_id=stage_id, delivered=[draft], output="feedback",
            decision=decision, round=r, iteration=iteration, template="refinement_loop",
        )  # fmt: skip
    tool = cfg.evaluator_tool or "binding_evaluate"
    with scope(stage_id=stage_id, stage_name=stage.name, session_id=f"{stage_id}.evaluator",
               round=r, iteration=iteration):  # fmt: skip
        return env.submit(
            tool_call, tool=tool, args=_tool_args(env, tool), inputs=[draft],
            arg_from=_tool_arg_from(tool), output="feedback", decision=decision,
        )  # fmt: skip


def _tool_args(env: RootEnv, tool: str) -> Mapping[str, object]:
    task = env.instance.inputs.get("task", {})
    if tool == "run_tests" and isinstance(task, Mapping):
        return {"tests": str(task.get("tests", "")), "timeout_s": 10.0}
    if tool == "binding_evaluate":
        return {"binding": env.binding.binding_id, "instance_id": env.instance.instance_id}
    return {}


def _tool_arg_from(tool: str) -> Mapping[str, str]:
    if tool == "run_tests":
        return {"code": "draft"}
    if tool == "binding_evaluate":
        return {"answer": "draft"}
    return {}


def _accepted(cfg: RefinementLoopConfig, feedback: Artifact) -> bool:
    if cfg.accept.rule is AcceptKind.NEVER:
        return False
    if cfg.accept.rule is AcceptKind.SCORE_AT_LEAST:
        assert cfg.accept.threshold is not None
        score = feedback.field("score")
        if score is not None:
            return float(score) >= cfg.accept.threshold
    return feedback.field("verdict") == "accept"


def run_refinement_loop(env: RootEnv, stage: Stage, stage_id: str, iteration: int = 0) -> Outputs:
    cfg = stage.control
    assert isinstance(cfg, RefinementLoopConfig)
    inputs = env.delivered(stage)
    feedback: Future | None = None
    draft: Future | None = None
    for r in range(1, cfg.max_rounds + 1):
        delivered = inputs + (
            [draft, feedback] if draft is not None and feedback is not None else []
        )
        draft = env.call(
            stage, cfg.generator_role, stage_id=stage_id, session=f"{stage_id}.generator",
            delivered=delivered, output="draft", round=r, iteration=iteration,
            template="refinement_loop",
            instruction="Revise the draft using the feedback." if r > 1 else "",
        )  # fmt: skip
        feedback = _evaluate(env, stage, cfg, stage_id, draft, r, iteration)
        if _accepted(cfg, resolve(feedback)):
            break
    assert draft is not None and feedback is not None
    with scope(stage_id=stage_id, stage_name=stage.name, session_id=f"{stage_id}.join"):
        review = env.submit(
            transform, fn="review", inputs=[draft, feedback], output=stage.outputs[0]
        )
    return _outputs(stage, review)


def _visible(cfg: DebateConfig, peer: int, n: int) -> list[int]:
    """Peers whose previous answers `peer` sees under the topology."""
    if cfg.topology is Topology.ALL_TO_ALL:
        return [j for j in range(n) if j != peer]
    if cfg.topology is Topology.RING:
        return [(peer - 1) % n]
    hub = cfg.peers.index(cfg.star_hub())
    return [j for j in range(n) if j != peer] if peer == hub else [hub]


def run_debate(env: RootEnv, stage: Stage, stage_id: str, iteration: int = 0) -> Outputs:
    cfg = stage.control
    assert isinstance(cfg, DebateConfig)
    inputs = env.delivered(stage)
    n = len(cfg.peers)
    rounds: list[list[Future]] = []
    if cfg.context is DebateContext.SUMMARY:
        ctx: ContextSpec | None = ContextSpec(
            history=HistoryMode.FRESH, delivery=Delivery.SELECTED, fields={"position": ("answer",)}
        )
    else:
        ctx = None
    synchronous = cfg.sync is SyncMode.SYNCHRONOUS
    # a peer whose session history is inherited already replays its own earlier answers
    own_history = (ctx or ContextSpec.from_rule(stage.context)).history is HistoryMode.INHERITED
    gate = None  # a round after a "go on" verdict waits for the op that gave it
    for r in range(1, cfg.rounds + 1):
        answers = []
        for i, peer in enumerate(cfg.peers):
            seen: list[Future | Artifact] = []
            if rounds:
                history = rounds if cfg.context is DebateContext.FULL_HISTORY else rounds[-1:]
                own = [] if own_history else [i]
                seen = [past[j] for past in history for j in own + _visible(cfg, i, n)]
            # the per-round barrier: every answer of the previous round (data where seen)
            barrier: list[Future] = list(rounds[-1]) if synchronous and rounds else []
            check = synchronous and i == 0 and r < cfg.rounds
            answers.append(
                env.call(
                    stage,
                    peer,
                    stage_id=stage_id,
                    session=f"{stage_id}.{peer}",
                    delivered=inputs + seen,
                    output="position",
                    round=r,
                    iteration=iteration,
                    context=ctx,
                    template="debate",
                    decision=Decision("converge", round=r) if check else None,
                    wait_for=barrier,
                )
            )
        env.close_gate(gate)
        rounds.append(answers)
        if cfg.sync is SyncMode.SYNCHRONOUS and r < cfg.rounds:
            if resolve(answers[0]).field("converged"):
                break  # what follows takes the last round, peer 0's answer included
            # on a ring or a star some next-round peers do not see peer 0's answer: the
            # convergence check is still what released them (a control edge)
            gate = env.open_gate(answers[:1])
    last: list[Future | Artifact] = list(rounds[-1])
    name = stage.outputs[0]
    if cfg.judge_role is not None:
        final: Future | Artifact = env.call(
            stage, cfg.judge_role, stage_id=stage_id, delivered=last, output=name,
            iteration=iteration, template="debate",
        )  # fmt: skip
    else:
        with scope(stage_id=stage_id, stage_name=stage.name, session_id=f"{stage_id}.join"):
            final = env.submit(transform, fn="concat", inputs=last, output=name)
    return _outputs(stage, final)


def run_spawn(env: RootEnv, stage: Stage, stage_id: str, iteration: int = 0) -> Outputs:
    cfg = stage.control
    assert isinstance(cfg, SpawnConfig)
    inputs = env.delivered(stage)
    parent_session = f"{stage_id}.{cfg.parent_role}"
    decided = cfg.children is ChildrenMode.DECIDED
    plan = env.call(
        stage, cfg.parent_role, stage_id=stage_id, session=parent_session, delivered=inputs,
        output="plan", iteration=iteration, template="spawn",
        decision=Decision("spawn", limit=cfg.bound()) if decided else None,
    )  # fmt: skip
    if decided:
        count = int(resolve(plan).field("count", 1))
    else:
        assert cfg.num_children is not None
        count = cfg.num_children
    child_ctx = ContextSpec(history=cfg.child_context)
    inherited = cfg.child_context is HistoryMode.INHERITED
    if inherited:  # a child continues the parent's conversation (which ends with the plan)
        for i in range(count):
            env.inherit(f"{stage_id}.child{i}", env.histories.get(parent_session, [plan]))
    children = [
        env.call(
            stage,
            cfg.child_role,
            stage_id=stage_id,
            session=f"{stage_id}.child{i}",
            delivered=[] if inherited else [plan],
            output="child_result",
            iteration=iteration,
            context=child_ctx,
            template="spawn",
        )
        for i in range(count)
    ]
    need = min(cfg.completion.required(cfg.bound()), count)
    chosen = children if need == count else [children[i] for i in first_k(children, need)]
    ret_ctx = (
        ContextSpec.selected({"child_result": ("summary",)})
        if cfg.return_mode is ReturnMode.SUMMARY
        else None
    )
    final = env.call(
        stage, cfg.parent_role, stage_id=stage_id, session=parent_session,
        delivered=[plan, *chosen], output=stage.outputs[0], iteration=iteration,
        context=ret_ctx, template="spawn", instruction="Combine the children's results.",
    )  # fmt: skip
    return _outputs(stage, final)


RUNNERS: Mapping[str, Callable[[RootEnv, Stage, str, int], Outputs]] = {
    "single": run_single,
    "tool": run_tool,
    "fork_join": run_fork_join,
    "refinement_loop": run_refinement_loop,
    "debate": run_debate,
    "spawn": run_spawn,
}


def run_stage(env: RootEnv, stage: Stage, stage_id: str, iteration: int = 0) -> Outputs:
    """Run one stage by its control kind and publish its outputs into `env.artifacts`."""
    outputs = RUNNERS[stage.control.kind](env, stage, stage_id, iteration)
    env.artifacts.update(outputs)
    env.done_stages.add(stage_id)
    return outputs
