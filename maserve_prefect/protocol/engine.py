"""The engine side of HEAR: the typed seam every backend (simulator, OpenAI, vLLM pool) implements.

Two levels. A `Replica` serves one deployment: `submit(request, controls)` answers at once with a
`Ticket` (accepted / rejected / unsupported) that later reports the first token and a final
`Outcome`; `state()` reports queues and KV use; `inform(intent)` records an intent and never causes
an action. A `Pool` owns devices and replicas and runs lifecycle actions (load / sleep / wake /
unload), each answered by a `LifecycleTicket`.

Controls carry their force. A control the engine cannot honour as a *requirement* makes the ticket
UNSUPPORTED — unless the control lists an allowed fallback the engine can honour, which is then
used and recorded in the outcome. An unhonoured *preference* is accepted, ignored, and noted in the
outcome. To add a control type, subclass `Control` (a slots dataclass) and list it in the
backend's `Capabilities.control_types`.

Plain slots dataclasses, no pydantic: these objects live on the simulator's hot path.

Examples:
    >>> req = Request("r1", "llama-8b", num_prompt_tokens=1024, max_tokens=64)
    >>> req.num_prompt()
    1024
    >>> Priority(3, force=Force.REQUIREMENT).force.name
    'REQUIREMENT'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any, Protocol

from maserve_prefect.clock import Clock, ClockFuture
from maserve_prefect.errors import RequestError, UnsupportedError

# ---------------------------------------------------------------------------------------------
# requests, controls, intents


@dataclass(frozen=True, slots=True)
class Request:
    """One generation call as an engine sees it.

    Exactly one prompt form: `prompt_token_ids`, or `num_prompt_tokens` (+ optional
    `prefix_block_hashes` of `prefix_block_size` tokens each, e.g. Mooncake's 512-token hash ids).

    Attributes:
        request_id: unique per engine.
        deployment: the model deployment that must serve it.
        max_tokens: output length target; with `min_tokens == max_tokens` the length is locked.
        priority: lower runs first under priority scheduling (vLLM convention).
        cache_salt: isolates prefix-cache reuse to requests with the same salt.
        tags: opaque ids (op id, root id) so step records join back to the ops that issued them.
        messages: the chat messages as (role, content) pairs, for engines that generate text
            (OpenAI-compatible servers); the simulator schedules on the token form alone.
    """

    request_id: str
    deployment: str
    prompt_token_ids: tuple[int, ...] | None = None
    num_prompt_tokens: int | None = None
    prefix_block_hashes: tuple[int, ...] = ()
    prefix_block_size: int = 0
    max_tokens: int = 1
    min_tokens: int = 0
    priority: int = 0
    cache_salt: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    messages: tuple[tuple[str, str], ...] | None = None

    def __post_init__(self) -> None:
        where = f"request {self.request_id!r}"
        has_ids = self.prompt_token_ids is not None
        has_len = self.num_prompt_tokens is not None
        if has_ids == has_len:
            raise RequestError(
                f"{where}: give exactly one of prompt_token_ids or num_prompt_tokens"
            )
        if has_ids and self.prefix_block_hashes:
            raise RequestError(
                f"{where}: prefix_block_hashes only go with num_prompt_tokens; "
                "token-id prompts are hashed from their ids"
            )
        if self.num_prompt() < 1:
            raise RequestError(f"{where}: the prompt must hold at least one token")
        if self.prefix_block_hashes:
            if self.prefix_block_size < 1:
                raise RequestError(f"{where}: prefix_block_hashes need prefix_block_size >= 1")
            covered = len(self.prefix_block_hashes) * self.prefix_block_size
            if covered > self.num_prompt() + self.prefix_block_size - 1:
                raise RequestError(
                    f"{where}: {len(self.prefix_block_hashes)} prefix blocks of "
                    f"{self.prefix_block_size} tokens exceed the {self.num_prompt()}-token prompt"
                )
        if self.max_tokens < 1:
            raise RequestError(f"{where}: max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise RequestError(
                f"{where}: need 0 <= min_tokens <= max_tokens, got "
                f"min_tokens={self.min_tokens}, max_tokens={self.max_tokens}"
            )

    def num_prompt(self) -> int:
        """Prompt length in tokens, whichever form the prompt has."""
        if self.prompt_token_ids is not None:
            return len(self.prompt_token_ids)
        assert self.num_prompt_tokens is not None
        return self.num_prompt_tokens


class Force(IntEnum):
    """How binding a control is."""

    PREFERENCE = 0
    REQUIREMENT = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Control:
    """Base of typed controls: a force and the fallbacks the caller allows (in order)."""

    force: Force = Force.PREFERENCE
    fallback: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class Priority(Control):
    """Run with this scheduling priority (lower first)."""

    value: int


@dataclass(frozen=True, slots=True)
class ExecutionMode(Control):
    """Run in a named execution mode (e.g. "default", "eager"); fallback lists other modes."""

    mode: str


@dataclass(frozen=True, slots=True)
class Intent:
    """Information only (role, dependencies, future reuse); engines record it, never act on it."""

    kind: str
    request_id: str | None = None
    payload: Mapping[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# answers


class Acceptance(Enum):
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    UNSUPPORTED = "unsupported"


class OutcomeStatus(Enum):
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try of a request at an engine (real engines retry 5xx, connection errors, timeouts).

    Times are on the engine's clock (seconds); `error` is None for the attempt that succeeded.
    """

    number: int
    start_s: float
    end_s: float
    error: str | None = None
    status_code: int | None = None


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


# ---------------------------------------------------------------------------------------------
# state and capabilities


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can honour; a control type not listed is unsupported."""

    control_types: tuple[type[Control], ...]
    accepts_token_ids: bool
    length_lock: bool
    priority_scheduling: bool
    prefix_caching: bool
    kv_events: bool
    sleep_levels: tuple[int, ...]
    modes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class EngineState:
    """A snapshot of one replica (never aliases live state)."""

    name: str
    deployment: str
    lifecycle: str
    num_running: int
    num_waiting: int
    kv_usage: float
    num_free_blocks: int
    num_total_blocks: int
    block_size: int
    counters: Mapping[str, float]


class LifecycleAction(Enum):
    LOAD = "load"
    SLEEP = "sleep"
    WAKE = "wake"
    UNLOAD = "unload"


@dataclass(slots=True)
class LifecycleTicket:
    """Answer to a lifecycle call: accepted or not at once; `done_s` when the action finished."""

    action: LifecycleAction
    replica: str
    acceptance: Acceptance
    reason: str = ""
    done_s: float | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """One device's memory as a Pool reports it."""

    device: str
    total_bytes: int
    used_bytes: int
    residents: tuple[str, ...]


class Replica(Protocol):
    """One deployment on one (set of) device(s)."""

    name: str
    deployment: str

    def capabilities(self) -> Capabilities: ...

    def submit(self, request: Request, controls: Sequence[Control] = ()) -> Ticket: ...

    def inform(self, intent: Intent) -> None: ...

    def state(self) -> EngineState: ...


class Pool(Protocol):
    """Devices and the replicas on them, with lifecycle actions."""

    def devices(self) -> Sequence[str]: ...

    def replicas(self) -> Sequence[Replica]: ...

    def load(self, deployment: str, device: str) -> LifecycleTicket: ...

    def sleep(self, replica: str, level: int = 1) -> LifecycleTicket: ...

    def wake(self, replica: str) -> LifecycleTicket: ...

    def unload(self, replica: str) -> LifecycleTicket: ...

    def memory(self, device: str) -> DeviceMemory: ...
