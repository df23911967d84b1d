"""`transform`: a recorded CPU transformation of artifacts (select a field, majority vote, join).

Transforms are registered by name so a trace names what ran; each is a pure function of its
input artifacts. They take no engine time (zero duration on the simulator clock).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace

from maserve_prefect.tasks.artifact import Artifact, FieldValue
from maserve_prefect.tasks.ops_common import op_task, this_op

from maserve_prefect.engines.sim.tokenizer import count_tokens
from maserve_prefect.errors import ConfigError
from maserve_prefect.trace.model import OpKind

TransformFn = Callable[[Sequence[Artifact], str], tuple[str, dict[str, FieldValue]]]
_TRANSFORMS: dict[str, TransformFn] = {}


def register_transform(name: str) -> Callable[[TransformFn], TransformFn]:
    """Register a transform under `name` (duplicates raise)."""

    def deco(fn: TransformFn) -> TransformFn:
        if name in _TRANSFORMS:
            raise ConfigError(f"a transform named {name!r} is already registered")
        _TRANSFORMS[name] = fn
        return fn

    return deco


def get_transform(name: str) -> TransformFn:
    """The transform registered as `name`.

    Raises:
        ConfigError: no transform has that name (the message lists the known ones).

    Examples:
        >>> votes = [Artifact("v", "yes.", {"answer": "yes"}),
        ...          Artifact("v", "no.", {"answer": "no"})]
        >>> get_transform("majority_vote")(votes, "answer")  # a 1-1 tie: the first vote wins
        ('yes.', {'answer': 'yes', 'support': 1, 'voters': 2})
    """
    try:
        return _TRANSFORMS[name]
    except KeyError:
        raise ConfigError(
            f"unknown transform {name!r}; known: {', '.join(sorted(_TRANSFORMS))}"
        ) from None


@register_transform("select_field")
def _select_field(inputs: Sequence[Artifact], arg: str) -> tuple[str, dict[str, FieldValue]]:
    values = [str(a.field(arg, "")) for a in inputs]
    return "\n".join(values), {arg: values[0] if values else ""}


@register_transform("majority_vote")
def _majority_vote(inputs: Sequence[Artifact], arg: str) -> tuple[str, dict[str, FieldValue]]:
    field = arg or "answer"
    votes = [str(a.field(field, "")) for a in inputs]
    counts = Counter(votes)
    # Most common; ties break by first appearance (deterministic).
    winner = max(counts, key=lambda v: (counts[v], -votes.index(v))) if votes else ""
    chosen = next((a for a in inputs if str(a.field(field, "")) == winner), None)
    text = chosen.text if chosen is not None else ""
    return text, {field: winner, "support": counts[winner], "voters": len(votes)}


@register_transform("review")
def _review(inputs: Sequence[Artifact], arg: str) -> tuple[str, dict[str, FieldValue]]:
    """A refinement loop's result: the last draft plus the evaluator's final verdict."""
    draft, feedback = inputs[0], inputs[-1]
    fields: dict[str, FieldValue] = {"draft": draft.text, **feedback.fields}
    fields.setdefault("verdict", "revise")
    return draft.text, fields


@register_transform("concat")
def _concat(inputs: Sequence[Artifact], arg: str) -> tuple[str, dict[str, FieldValue]]:
    return "\n\n".join(a.text for a in inputs), {}


@op_task(OpKind.TRANSFORM)
def transform(
    *, fn: str, inputs: Sequence[Artifact], arg: str = "", output: str = "output"
) -> Artifact:
    """Apply the registered transform `fn` to `inputs`."""
    op, h = this_op("transform")
    impl = get_transform(fn)
    op.tool_name = fn
    op.input_refs = [a.digest for a in inputs if a.digest]
    text, fields = impl(inputs, arg)
    art = Artifact(output, text, fields, num_tokens=count_tokens(text), producer=op.op_id)
    art = replace(art, digest=h.store.put(art.payload()))
    op.output_ref = art.digest
    return art
