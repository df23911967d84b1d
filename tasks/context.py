"""Context construction: turn a stage's context rule and delivered artifacts into model input.

Order of a prompt: the role's system prompt; the inherited history (only with `history:
inherited`); one user turn holding the task input (if any), then each delivered artifact in
delivery order — whole under `full` delivery; under `selected`, an artifact named in `fields` is
reduced to those fields and any other is delivered whole (so a rolling summary can take one chunk
of a document plus the whole running summary) — then the turn's instruction. Selected vs Full therefore changes the realized input length, and with it the work
the engine does; that is the point of the four-call control experiment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from maserve_prefect.tasks.artifact import Artifact

from maserve_prefect.spec.rules import Delivery, HistoryMode
from maserve_prefect.spec.stages import ContextRule

Message = tuple[str, str]


@dataclass(frozen=True, slots=True)
class ContextSpec:
    """A stage's context rule in the plain form ops receive (picklable, no pydantic)."""

    history: HistoryMode = HistoryMode.FRESH
    delivery: Delivery = Delivery.FULL
    fields: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def from_rule(cls, rule: ContextRule) -> ContextSpec:
        return cls(history=rule.history, delivery=rule.delivery, fields=dict(rule.fields))

    @classmethod
    def selected(cls, fields: Mapping[str, tuple[str, ...]]) -> ContextSpec:
        return cls(delivery=Delivery.SELECTED, fields=dict(fields))


FULL_CONTEXT = ContextSpec()
"""Fresh history, full delivery: the default context."""


def render_artifact(art: Artifact, ctx: ContextSpec) -> str:
    """One delivered artifact as prompt text under the delivery rule."""
    if ctx.delivery is Delivery.SELECTED and art.name in ctx.fields:
        return f"[{art.name} from {art.producer or 'input'}] {art.select(ctx.fields.get(art.name, ()))}"
    return f"[{art.name} from {art.producer or 'input'}]\n{art.text}"


def build_messages(
    system: str,
    task_input: str,
    *,
    delivered: Sequence[Artifact] = (),
    history: Sequence[Message] = (),
    context: ContextSpec = FULL_CONTEXT,
    instruction: str = "",
) -> tuple[Message, ...]:
    """The chat messages of one model call.

    Examples:
        The order: system, inherited history, then one user turn of task input, delivered
        artifacts (in delivery order) and instruction.

        >>> d1, d2 = Artifact("plan", "step one", producer="r/p/0"), Artifact("notes", "n")
        >>> msgs = build_messages("sys", "solve it", delivered=[d1, d2], instruction="answer",
        ...                       history=[("user", "earlier"), ("assistant", "reply")],
        ...                       context=ContextSpec(history=HistoryMode.INHERITED))
        >>> [role for role, _ in msgs]
        ['system', 'user', 'assistant', 'user']
        >>> print(msgs[-1][1])
        solve it
        <BLANKLINE>
        [plan from r/p/0]
        step one
        <BLANKLINE>
        [notes from input]
        n
        <BLANKLINE>
        answer

        Selected delivery shortens an artifact named in `fields` to those fields:

        >>> a = Artifact("analysis", "long text " * 50, {"claim": "x rises"}, producer="r/a/0")
        >>> full = build_messages("sys", "task", delivered=[a])
        >>> sel = build_messages("sys", "task", delivered=[a],
        ...                      context=ContextSpec.selected({"analysis": ("claim",)}))
        >>> len(sel[-1][1]) < len(full[-1][1])
        True
    """
    messages: list[Message] = [("system", system)]
    if context.history is HistoryMode.INHERITED:
        messages.extend(history)
    parts = [task_input] if task_input else []
    parts.extend(render_artifact(a, context) for a in delivered)
    if instruction:
        parts.append(instruction)
    messages.append(("user", "\n\n".join(parts)))
    return tuple(messages)
