"""HEAR category 4 — Execution Outcomes: what really happened to a subject.

One idea: acceptance is not completion. `Accepted` is its own type, with no token counts, cache
reuse or finish time, and `is_final = False`; only `Completed` carries results, and
`require_completed` refuses anything else. The other final answers are `Rejected` (the engine
will not take it: too long, draining), `Unsupported` (a *requirement* it cannot honour, named in
`requirements`) and `Failed` (it ran and broke, with its attempts and error). Every answer names
its subject and, once running, the `Realization`: the mode it ran in, the fallbacks used in place
of requested controls, and the preferences dropped.

`outcome_of(ticket)` reads an engine-seam `Ticket` as a HEAR outcome.

Examples:
    >>> acc = Accepted(RequestRef("r1"), at_s=0.0, realization=Realization("default"))
    >>> acc.is_final, acc.kind.value
    (False, 'accepted')
    >>> require_completed(acc)
    Traceback (most recent call last):
    ...
    maserve_prefect.errors.EngineError: request:r1 is accepted, not completed; wait for its outcome (Ticket.on_done / wait_done) before reading results
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

from maserve_prefect.clock import Clock, ClockFuture
from maserve_prefect.errors import EngineError, UnsupportedError
from maserve_prefect.protocol.controls import Control
from maserve_prefect.protocol.subjects import RequestRef, Subject, subject_key


class Acceptance(Enum):
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    UNSUPPORTED = "unsupported"


class OutcomeStatus(Enum):
    """How a request ended. REJECTED is never an engine's answer to an accepted request: the
    dispatcher gives it to a unit the engine refused at submission (`Ticket.acceptance`), so its
    caller still gets exactly one outcome per request."""

    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try of a request at an engine (real engines retry 5xx, connection errors, timeouts).

    Times are on the engine's clock (seconds); `error` is None for the attempt that succeeded.
    `kind` classifies a failed attempt when the engine did ("connection", "timeout", "5xx", ...:
    `engines.openai.retry.ERROR_KINDS`); a fleet takes "connection" and "timeout" to mean the
    endpoint stopped answering.
    """

    number: int
    start_s: float
    end_s: float
    error: str | None = None
    status_code: int | None = None
    kind: str | None = None


@dataclass(slots=True)
class Outcome:
    """The final word on an accepted request. Times are on the engine's clock (seconds)."""

    request_id: str
    status: OutcomeStatus
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    num_preemptions: int
    realized_mode: str
    arrival_s: float
    first_scheduled_s: float | None
    first_token_s: float | None
    finish_s: float
    notes: tuple[str, ...] = ()
    error: str | None = None
    output_text: str | None = None
    output_token_ids: tuple[int, ...] | None = None
    attempts: tuple[Attempt, ...] = ()
    num_cached_host_tokens: int = 0
    """Of `num_cached_tokens`, those loaded from a host (CPU) KV tier; 0 without one or when
    the engine cannot tell (the OpenAI/vLLM side)."""


class Ticket:
    """The answer to `submit`: acceptance at once, then first token and outcome via callbacks.

    Examples:
        >>> t = Ticket("r1", Acceptance.ACCEPTED)
        >>> seen = []
        >>> t.on_first_token(seen.append)
        >>> t.resolve_first_token(0.5)
        >>> seen
        [0.5]
    """

    __slots__ = (
        "_done_cbs",
        "_first_cbs",
        "acceptance",
        "first_token_s",
        "notes",
        "outcome",
        "reason",
        "request_id",
    )

    def __init__(
        self,
        request_id: str,
        acceptance: Acceptance,
        reason: str = "",
        notes: tuple[str, ...] = (),
    ) -> None:
        self.request_id = request_id
        self.acceptance = acceptance
        self.reason = reason
        self.notes = notes
        self.first_token_s: float | None = None
        self.outcome: Outcome | None = None
        self._first_cbs: list[Callable[[float], None]] = []
        self._done_cbs: list[Callable[[Outcome], None]] = []

    @property
    def accepted(self) -> bool:
        return self.acceptance is Acceptance.ACCEPTED

    def on_first_token(self, cb: Callable[[float], None]) -> None:
        """Call `cb(first_token_s)` when the first token exists (at once if it already does)."""
        if self.first_token_s is not None:
            cb(self.first_token_s)
        else:
            self._first_cbs.append(cb)

    def on_done(self, cb: Callable[[Outcome], None]) -> None:
        """Call `cb(outcome)` when the request ends (at once if it already has)."""
        if self.outcome is not None:
            cb(self.outcome)
        else:
            self._done_cbs.append(cb)

    def wait_done(self, clock: Clock) -> ClockFuture:
        """An awaitable for the outcome on `clock` (kernel process or asyncio task alike).

        Raises:
            UnsupportedError: the ticket was not accepted, so no outcome will come.
        """
        if not self.accepted:
            raise UnsupportedError(
                f"request {self.request_id!r} was {self.acceptance.value}: {self.reason}; "
                "check ticket.acceptance before waiting"
            )
        fut = clock.create_future()
        self.on_done(fut.set_result)
        return fut

    def resolve_first_token(self, t_s: float) -> None:
        """Engine side: record the first token time and notify."""
        self.first_token_s = t_s
        cbs, self._first_cbs = self._first_cbs, []
        for cb in cbs:
            cb(t_s)

    def resolve(self, outcome: Outcome) -> None:
        """Engine side: record the outcome and notify."""
        self.outcome = outcome
        cbs, self._done_cbs = self._done_cbs, []
        for cb in cbs:
            cb(outcome)


class OutcomeKind(Enum):
    ACCEPTED = "accepted"
    COMPLETED = "completed"
    REJECTED = "rejected"
    UNSUPPORTED = "unsupported"
    FAILED = "failed"

    @property
    def is_final(self) -> bool:
        """Every kind but ACCEPTED is the last word on its subject."""
        return self is not OutcomeKind.ACCEPTED


@dataclass(frozen=True, slots=True)
class FallbackUsed:
    """An explicitly allowed fallback the engine used in place of the requested control."""

    requested: Control
    used: Control

    def note(self) -> str:
        return f"fallback: {self.requested!r} -> {self.used!r}"


@dataclass(frozen=True, slots=True)
class Realization:
    """How a request actually runs: mode, fallbacks used, preferences dropped (as notes)."""

    mode: str
    fallbacks: tuple[FallbackUsed, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CacheReuse:
    """Prompt tokens served from cache, split by tier (GPU hits vs CPU-host reloads).

    `num_cached_cpu_tokens` is the part of `num_cached_tokens` loaded back from a host (CPU) KV
    tier (the seam's `Outcome.num_cached_host_tokens`); 0 without one.
    """

    num_prompt_tokens: int
    num_cached_tokens: int
    num_cached_cpu_tokens: int = 0

    @property
    def fraction(self) -> float:
        return self.num_cached_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0


@dataclass(frozen=True, slots=True)
class Latency:
    """Engine-clock timestamps (seconds) and the intervals derived from them."""

    arrival_s: float
    first_scheduled_s: float | None
    first_token_s: float | None
    finish_s: float

    @property
    def queue_s(self) -> float | None:
        return None if self.first_scheduled_s is None else self.first_scheduled_s - self.arrival_s

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float:
        return self.finish_s - self.arrival_s


@dataclass(frozen=True, slots=True)
class Resources:
    """What the request consumed."""

    num_prompt_tokens: int
    num_output_tokens: int
    num_preemptions: int = 0


@dataclass(frozen=True, slots=True)
class Accepted:
    """Taken in; NOT done. Holds no results (see the module docstring)."""

    kind: ClassVar[OutcomeKind] = OutcomeKind.ACCEPTED
    is_final: ClassVar[bool] = False

    subject: Subject
    at_s: float | None
    realization: Realization


@dataclass(frozen=True, slots=True)
class Completed:
    """Ran to the end; the only outcome with results."""

    kind: ClassVar[OutcomeKind] = OutcomeKind.COMPLETED
    is_final: ClassVar[bool] = True

    subject: Subject
    realization: Realization
    cache: CacheReuse
    latency: Latency
    resources: Resources
    attempts: tuple[Attempt, ...] = ()

    @property
    def num_retries(self) -> int:
        return max(0, len(self.attempts) - 1)


@dataclass(frozen=True, slots=True)
class Rejected:
    """Not taken (capacity, length, lifecycle); `reason` says why and what to do."""

    kind: ClassVar[OutcomeKind] = OutcomeKind.REJECTED
    is_final: ClassVar[bool] = True

    subject: Subject
    reason: str


@dataclass(frozen=True, slots=True)
class Unsupported:
    """A requirement the engine cannot honour, with no allowed fallback it can; names them."""

    kind: ClassVar[OutcomeKind] = OutcomeKind.UNSUPPORTED
    is_final: ClassVar[bool] = True

    subject: Subject
    reason: str
    requirements: tuple[Control, ...] = ()


@dataclass(frozen=True, slots=True)
class Failed:
    """Ran and broke: the error, every attempt, and how far it got."""

    kind: ClassVar[OutcomeKind] = OutcomeKind.FAILED
    is_final: ClassVar[bool] = True

    subject: Subject
    error: str
    attempts: tuple[Attempt, ...] = ()
    realization: Realization | None = None

    @property
    def num_retries(self) -> int:
        return max(0, len(self.attempts) - 1)


HearOutcome = Accepted | Completed | Rejected | Unsupported | Failed


def require_completed(outcome: HearOutcome) -> Completed:
    """The outcome as `Completed`, or an error: code cannot read results off an acceptance.

    Raises:
        EngineError: the outcome is not COMPLETED (accepted only, or a final non-success).
    """
    if isinstance(outcome, Completed):
        return outcome
    where = subject_key(outcome.subject)
    if isinstance(outcome, Accepted):
        raise EngineError(
            f"{where} is accepted, not completed; wait for its outcome "
            "(Ticket.on_done / wait_done) before reading results"
        )
    raise EngineError(f"{where} ended {outcome.kind.value}, not completed: {_why(outcome)}")


def _why(outcome: Rejected | Unsupported | Failed) -> str:
    return outcome.error if isinstance(outcome, Failed) else outcome.reason


def outcome_of(ticket: Ticket, fallbacks: tuple[FallbackUsed, ...] = ()) -> HearOutcome:
    """Read an engine-seam ticket as a HEAR outcome (the latest that is known).

    Args:
        ticket: the answer `Replica.submit` gave.
        fallbacks: the fallbacks the engine's `force.resolve` recorded, when the caller has them
            (the seam's `Outcome` carries them only as text notes).
    """
    subject = RequestRef(ticket.request_id)
    if ticket.acceptance is Acceptance.REJECTED:
        return Rejected(subject, ticket.reason)
    if ticket.acceptance is Acceptance.UNSUPPORTED:
        return Unsupported(subject, ticket.reason)
    out = ticket.outcome
    if out is None:
        return Accepted(subject, None, Realization("", fallbacks, ticket.notes))
    realization = Realization(out.realized_mode, fallbacks, out.notes)
    if out.status is OutcomeStatus.COMPLETED:
        return _completed(subject, out, realization)
    return Failed(subject, out.error or out.status.value, out.attempts, realization)


def _completed(subject: RequestRef, out: Outcome, realization: Realization) -> Completed:
    return Completed(
        subject,
        realization,
        CacheReuse(out.num_prompt_tokens, out.num_cached_tokens, out.num_cached_host_tokens),
        Latency(out.arrival_s, out.first_scheduled_s, out.first_token_s, out.finish_s),
        Resources(out.num_prompt_tokens, out.num_output_tokens, out.num_preemptions),
        out.attempts,
    )
