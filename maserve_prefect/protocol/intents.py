"""HEAR category 1 — Execution Description & Intent: what the harness knows, never an order.

One idea: an intent *informs*. Roles, stages, dependencies and readiness, sizes and output
limits, context lifecycles and known future uses travel on the intent channel
(`Channel.inform` / `Replica.inform`), which returns nothing and changes no state that
scheduling reads. To make an engine *do* something (retain a prefix, run in a mode) the harness
sends a control (`protocol.controls`). Anything guessed rather than known is wrapped in
`Prediction[T]` (`is_prediction=True`, with its source), so no receiver can mistake a forecast
for a fact.

`encode_intent` flattens a typed intent into the engine seam's `protocol.Intent` (kind + string
payload) so any `Replica` can record it.

Examples:
    >>> p = Prediction(120, source="lgbm-v2")
    >>> p.is_prediction, p.value
    (True, 120)
    >>> msg = SizeIntent(RequestRef("r1"), 1024, 256, expected_output_tokens=p)
    >>> e = encode_intent(msg)
    >>> e.kind, e.request_id, e.payload["expected_output_tokens"], e.payload["expected_output_tokens.source"]
    ('size', 'r1', '120', 'lgbm-v2')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar

from maserve_prefect.errors import RequestError
from maserve_prefect.protocol.subjects import ContextRef, RequestRef, subject_key


@dataclass(frozen=True, slots=True)
class Intent:
    """Information only (role, dependencies, future reuse); engines record it, never act on it."""

    kind: str
    request_id: str | None = None
    payload: Mapping[str, str] = field(default_factory=dict)


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Prediction(Generic[T]):
    """A forecast, explicitly marked as one.

    Attributes:
        value: the predicted value.
        source: who predicted it (model name, heuristic); never empty.
        is_prediction: always True; lets receivers test without isinstance.
    """

    value: T
    source: str
    is_prediction: bool = field(default=True, init=False)

    def __post_init__(self) -> None:
        if not self.source:
            raise RequestError(
                f"Prediction({self.value!r}) needs a source (the model or heuristic that made it)"
            )


class Readiness(Enum):
    """How close a request is to being releasable (the dispatcher's event vocabulary)."""

    BLOCKED = "blocked"  # some predecessor has not started
    NEAR_READY = "near_ready"  # every predecessor done or running, at least one running
    READY = "ready"  # every required predecessor done


class ContextAction(Enum):
    """A context's lifecycle step."""

    OPEN = "open"
    EXTEND = "extend"
    CLOSE = "close"


@dataclass(frozen=True, slots=True)
class RoleIntent:
    """The agent role a request plays (e.g. "planner", "critic")."""

    subject: RequestRef
    role: str


@dataclass(frozen=True, slots=True)
class StageIntent:
    """The collaboration stage a request belongs to (kind: spawn, fork_join, debate, ...)."""

    subject: RequestRef
    stage_id: str
    stage_kind: str = ""
    iteration: int = 0


@dataclass(frozen=True, slots=True)
class DependencyIntent:
    """The requests this one waits on, and how ready it is now."""

    subject: RequestRef
    depends_on: tuple[str, ...]
    readiness: Readiness


@dataclass(frozen=True, slots=True)
class SizeIntent:
    """Prompt size and output limit; the expected output length is a prediction when given."""

    subject: RequestRef
    num_prompt_tokens: int
    max_tokens: int
    expected_output_tokens: Prediction[int] | None = None

    def __post_init__(self) -> None:
        if self.num_prompt_tokens < 1 or self.max_tokens < 1:
            raise RequestError(
                f"SizeIntent for {subject_key(self.subject)}: num_prompt_tokens and max_tokens "
                f"must be >= 1, got {self.num_prompt_tokens} and {self.max_tokens}"
            )


@dataclass(frozen=True, slots=True)
class ContextIntent:
    """A context lifecycle step: OPEN at version 0, EXTEND to version >= 1, or CLOSE.

    Attributes:
        num_tokens: the context's length at this version.
        block_hashes: its prefix block hashes, when the harness knows them.
        request_id: the request that opened or extended it, if any.
    """

    subject: ContextRef
    action: ContextAction
    num_tokens: int = 0
    block_hashes: tuple[int, ...] = ()
    request_id: str | None = None

    def __post_init__(self) -> None:
        where = f"ContextIntent {self.action.value} for {subject_key(self.subject)}"
        if self.action is ContextAction.OPEN and self.subject.version != 0:
            raise RequestError(f"{where}: a context opens at version 0")
        if self.action is ContextAction.EXTEND and self.subject.version < 1:
            raise RequestError(f"{where}: an extension names the new version (>= 1)")
        if self.num_tokens < 0:
            raise RequestError(f"{where}: num_tokens must be >= 0")


@dataclass(frozen=True, slots=True)
class FutureUseIntent:
    """Uses of a context still to come: known (plain numbers) or forecast (`Prediction`).

    Attributes:
        num_uses: how many more requests will read the context.
        within_s: when the next one comes, in seconds from now (None: unknown).
    """

    subject: ContextRef
    num_uses: int | Prediction[int]
    within_s: float | Prediction[float] | None = None

    @property
    def is_predicted(self) -> bool:
        """True when any part of it is a forecast rather than a known fact."""
        return isinstance(self.num_uses, Prediction) or isinstance(self.within_s, Prediction)


@dataclass(frozen=True, slots=True)
class ContinuationIntent:
    """How likely a context is to be read again, told when a request on it completes — a
    forecast, never a request to retain anything (HEAR's Session-Aware policy).

    An engine may fold it into decisions it takes anyway — what to evict when it needs room —
    together with its own recency information; the simulator does (`engines.sim.hear.side`).

    Attributes:
        p_return: the forecast probability that another request reads the context.
        block_hashes: the context's prefix blocks (the engine's own block hashes).
    """

    subject: ContextRef
    p_return: Prediction[float]
    block_hashes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.p_return.value <= 1.0:
            raise RequestError(
                f"ContinuationIntent for {subject_key(self.subject)}: p_return must be in "
                f"[0, 1], got {self.p_return.value}"
            )


IntentMessage = (
    RoleIntent
    | StageIntent
    | DependencyIntent
    | SizeIntent
    | ContextIntent
    | FutureUseIntent
    | ContinuationIntent
)

_KINDS: dict[type, str] = {
    RoleIntent: "role",
    StageIntent: "stage",
    DependencyIntent: "dependency",
    SizeIntent: "size",
    ContextIntent: "context",
    FutureUseIntent: "future_use",
    ContinuationIntent: "continuation",
}


def encode_intent(msg: IntentMessage) -> Intent:
    """Flatten a typed intent into the engine seam's `Intent` (every value as text).

    A predicted field `f` gives `f`, `f.predicted = "true"` and `f.source`.

    Raises:
        RequestError: `msg` is not a HEAR intent message (controls are not intents).
    """
    kind = _KINDS.get(type(msg))
    if kind is None:
        raise RequestError(
            f"encode_intent: {type(msg).__name__} is not a HEAR intent; controls go with "
            "submit(), intents are RoleIntent, StageIntent, DependencyIntent, SizeIntent, "
            "ContextIntent, FutureUseIntent or ContinuationIntent"
        )
    payload: dict[str, str] = {"subject": subject_key(msg.subject)}
    for f in dataclasses.fields(msg):
        if f.name == "subject":
            continue
        value = getattr(msg, f.name)
        if isinstance(value, Prediction):
            payload[f.name] = str(value.value)
            payload[f"{f.name}.predicted"] = "true"
            payload[f"{f.name}.source"] = value.source
        elif isinstance(value, Enum):
            payload[f.name] = str(value.value)
        elif isinstance(value, tuple):
            payload[f.name] = ",".join(str(v) for v in value)
        elif value is not None:
            payload[f.name] = str(value)
    request_id = msg.subject.request_id if isinstance(msg.subject, RequestRef) else None
    if isinstance(msg, ContextIntent) and msg.request_id is not None:
        request_id = msg.request_id
    return Intent(kind, request_id, payload)
