"""`model_call`: one LLM call as a Prefect task, recorded as a model op.

It builds the messages from the stage's context rule, sends the request to the engine through the
harness's dispatcher, and returns an `Artifact`. On the simulator there is no text: the output
length and the template decisions (accept, converge, spawn count, vote) are drawn from the
binding's seeded content model and capped as vLLM caps it (at `max_tokens` and at the deployment's
max model length less the prompt, `capped_output`), and the payload is deterministic synthetic
text of the delivered answer's length (the output less its modeled reasoning, the binding's
answer share) — stored in the CAS like a real output. On a real engine the output text comes back and
decisions are parsed from it (ACCEPT/REVISE, AGREE, the first integer, the final answer).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from maserve_prefect.bindings.content import Given
from maserve_prefect.tasks.artifact import Artifact, FieldValue
from maserve_prefect.tasks.context import (
    FULL_CONTEXT,
    ContextSpec,
    Message,
    build_messages,
    render_artifact,
)
from maserve_prefect.tasks.ops_common import op_task, this_op

from maserve_prefect.engines.sim.tokenizer import chat_token_ids, count_tokens
from maserve_prefect.errors import EngineError
from maserve_prefect.protocol.outcomes import OutcomeStatus
from maserve_prefect.protocol.requests import DEFAULT_MAX_TOKENS, Request
from maserve_prefect.taskrunner.harness import Harness
from maserve_prefect.taskrunner.oprun import OpRun
from maserve_prefect.trace.cas import canonical_json
from maserve_prefect.trace.model import GenerationSettings, OpKind

TURN_FIELD = "_turn"
"""Artifact field holding the CAS digest of the user turn that produced a model output, so a
later call with inherited history can replay the exchange exactly."""


class ModelCallError(EngineError):
    """A model call failed at the engine (rejected, unsupported, or failed)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """A template decision this call's output carries.

    kind: "accept" (refinement verdict at `round`), "converge" (debate after `round`),
    "spawn" (children in [1, `limit`]), "vote" (voter `index` of `limit` in group `group`).
    """

    kind: str
    round: int = 1
    limit: int = 1
    index: int = 0
    group: str = ""


def _decide(
    decision: Decision | None, text: str, h: Harness, op: OpRun, given: Given
) -> dict[str, FieldValue]:
    if decision is None:
        return {}
    root = op.scope.root_id
    if h.draws_content:
        c = h.content
        assert c is not None
        if decision.kind == "accept":
            ok = c.accepts(decision.round, root=root, op=op.op_id, given=given)
            return {"verdict": "accept" if ok else "revise"}
        if decision.kind == "converge":
            return {"converged": c.converges(decision.round, root=root, op=op.op_id, given=given)}
        if decision.kind == "spawn":
            return {"count": c.spawn_count(decision.limit, root=root, op=op.op_id, given=given)}
        if decision.kind == "vote":
            group = decision.group or op.scope.stage_id
            votes = c.votes(decision.limit, root=root, op=group, given=given)
            return {"answer": f"answer-{votes[decision.index]}"}
    if decision.kind == "accept":
        return {"verdict": "accept" if re.search(r"\bACCEPT", text, re.I) else "revise"}
    if decision.kind == "converge":
        return {"converged": bool(re.search(r"\b(AGREE|CONVERGED)\b", text, re.I))}
    if decision.kind == "spawn":
        m = re.search(r"\d+", text)
        n = int(m.group()) if m else 1
        return {"count": max(1, min(decision.limit, n))}
    if decision.kind == "vote":
        nums = re.findall(r"-?\d+(?:\.\d+)?", text)
        return {"answer": nums[-1] if nums else text.strip()[:40]}
    raise ValueError(f"unknown decision kind {decision.kind!r}")


def capped_output(
    natural: int, max_tokens: int | None, max_model_len: int | None, num_prompt: int
) -> int:
    """A drawn output length as vLLM caps it: at the request's `max_tokens` and at the context
    left after the prompt (`max_model_len - num_prompt`; the output stops there, with finish
    reason "length"). A prompt that leaves no room is left to the engine to refuse.

    Examples:
        >>> capped_output(3000, None, 8192, 6000), capped_output(3000, 2048, 8192, 100)
        (2192, 2048)
        >>> capped_output(3000, None, None, 9000), capped_output(300, None, 8192, 8192)
        (3000, 300)
    """
    n = natural if max_tokens is None else min(natural, max_tokens)
    if max_model_len is not None and num_prompt < max_model_len:
        n = min(n, max_model_len - num_prompt)
    return n


@op_task(OpKind.MODEL)
def model_call(
    *,
    role: str,
    deployment: str,
    system: str,
    task_input: str = "",
    delivered: Sequence[Artifact] = (),
    history: Sequence[Artifact] = (),
    context: ContextSpec = FULL_CONTEXT,
    instruction: str = "",
    output: str = "output",
    decision: Decision | None = None,
    max_tokens: int | None = None,
    temperature: float = 0.0,
    priority: int = 0,
) -> Artifact:
    """Call the model of `deployment` as `role` and return its output artifact.

    Args:
        role: participant role (selects the content model's length distribution on the sim).
        deployment: the deployment name the engine pool serves.
        system: the role prompt.
        task_input: the task instance's input text.
        delivered: upstream artifacts (pass futures: they become data edges).
        history: the session's earlier outputs (pass futures: data edges); with `history:
            inherited` each is replayed as its user turn and the model's answer.
        context: delivery rule (Full vs Selected).
        instruction: the turn's instruction.
        output: name of the produced artifact.
        decision: a template decision carried by the output.
        max_tokens: output limit (on the simulator the length is drawn, capped at this and at
            the context the prompt leaves, `capped_output`, and locked); the deployment's
            output budget (pool file `max_tokens`) caps it too.
        temperature, priority: generation settings.
    """
    op, h = this_op("model_call")
    max_tokens = h.output_budget(deployment, max_tokens)
    turns: list[Message] = []
    for earlier in history:
        ref = earlier.field(TURN_FIELD)
        turns.append(("user", h.store.get(ref).decode() if ref else ""))
        turns.append(("assistant", earlier.text))
    messages = build_messages(
        system,
        task_input,
        delivered=delivered,
        history=turns,
        context=context,
        instruction=instruction,
    )
    op.input_refs = [h.store.put(canonical_json([list(m) for m in messages]))]
    # what this call was given: its delivered artifacts and replayed turns as rendered, and the
    # digest of its resolved prompt (the content model's context response reads both)
    given = Given(
        delivered_tokens=sum(count_tokens(render_artifact(a, context)) for a in delivered)
        + sum(count_tokens(text) for _, text in turns),
        digest=op.input_refs[0],
    )
    op.input_refs += [a.digest for a in (*history, *delivered) if a.digest]
    turn_ref = h.store.put(messages[-1][1].encode())
    prompt_ids = tuple(chat_token_ids(messages))
    tags = {"op": op.op_id, "root": op.scope.root_id, "workflow": op.scope.workflow}
    if h.engine_kind == "sim":
        if h.content is None:
            raise ModelCallError(f"op {op.op_id}: simulator runs need a content model")
        n_out = h.content.output_tokens(role, root=op.scope.root_id, op=op.op_id, given=given)
        n_out = capped_output(n_out, max_tokens, h.context_limit(deployment), len(prompt_ids))
        request = Request(
            op.op_id, deployment, prompt_token_ids=prompt_ids, max_tokens=n_out,
            min_tokens=n_out, priority=priority, tags=tags, messages=messages,
        )  # fmt: skip
    elif h.draws_content:  # a real engine generating the text at the binding's drawn length
        assert h.content is not None
        n_out = h.content.output_tokens(role, root=op.scope.root_id, op=op.op_id, given=given)
        n_out = capped_output(n_out, max_tokens, h.context_limit(deployment), len(prompt_ids))
        request = Request(
            op.op_id, deployment, num_prompt_tokens=len(prompt_ids), max_tokens=n_out,
            min_tokens=n_out, priority=priority, tags=tags, messages=messages,
        )  # fmt: skip
    else:
        limit = max_tokens or DEFAULT_MAX_TOKENS
        request = Request(
            op.op_id, deployment, num_prompt_tokens=len(prompt_ids), max_tokens=limit,
            priority=priority, tags=tags, messages=messages,
        )  # fmt: skip
    op.generation = GenerationSettings(
        deployment=deployment,
        max_tokens=request.max_tokens,
        min_tokens=request.min_tokens or None,
        temperature=temperature,
        priority=priority,
    )
    outcome = h.call_model(op, request)
    if outcome.status is not OutcomeStatus.COMPLETED:
        raise ModelCallError(
            f"op {op.op_id} on {deployment!r}: {outcome.error or outcome.status.value}"
        )
    if outcome.output_text is not None:
        text = outcome.output_text
    else:
        assert h.content is not None
        # the delivered answer: the output less its reasoning (`bindings.content`, answer share)
        n_answer = h.content.answer_tokens(outcome.num_output_tokens)
        text = h.content.payload_text(n_answer, root=op.scope.root_id, op=op.op_id)
    art = Artifact(
        name=output,
        text=text,
        fields={**_decide(decision, text, h, op, given), TURN_FIELD: turn_ref},
        num_tokens=outcome.num_output_tokens or count_tokens(text),
        producer=op.op_id,
    )
    art = replace(art, digest=h.store.put(art.payload()))
    op.output_ref = art.digest
    ids = outcome.output_token_ids or tuple(chat_token_ids([("assistant", text)])[3:-1])
    op.output_token_ids_ref = h.store.put(canonical_json(list(ids)))
    return art
