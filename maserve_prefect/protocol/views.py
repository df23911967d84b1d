"""The typed, read-only views HEAR policies decide over: waiting requests and sessions.

One idea: a policy is a pure function of these views plus a `state.ResidencyView` and `now_s`.
The views are frozen copies built by whoever calls the policy (the dispatcher's snapshot, an
engine side's queue), so a policy can never alias or change live state.

Examples:
    >>> w = WaitingRequest("r1", arrival_s=2.0, num_prompt_tokens=64, block_hashes=(7, 8))
    >>> w.wait_s(now_s=5.0)
    3.0
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from maserve_prefect.errors import RequestError
from maserve_prefect.protocol.subjects import ContextRef

T = TypeVar("T")


def fcfs_order(
    items: Iterable[T], arrival_s: Callable[[T], float], ident: Callable[[T], str]
) -> list[T]:
    """First come, first served: by arrival, ties by id — the one FCFS order of the project (the
    dispatcher's `fcfs` plan, HEAR's `Fcfs` policy and every ordering policy's tie-break).

    Examples:
        >>> fcfs_order([("b", 1.0), ("a", 1.0), ("c", 0.5)], lambda x: x[1], lambda x: x[0])
        [('c', 0.5), ('a', 1.0), ('b', 1.0)]
    """
    return sorted(items, key=lambda x: (arrival_s(x), ident(x)))


@dataclass(frozen=True, slots=True)
class WaitingRequest:
    """One request waiting to run.

    Attributes:
        request_id: the engine's id for it.
        arrival_s: when it started waiting (the policy's clock).
        num_prompt_tokens: its prompt length.
        block_hashes: its prompt's prefix block hashes, in order (block size: the residency
            view's).
        role: the agent role (for role -> mode selection).
        max_wait_s: its own waiting-time requirement (`controls.MaxWait`), if any.
    """

    request_id: str
    arrival_s: float
    num_prompt_tokens: int
    block_hashes: tuple[int, ...] = ()
    role: str = ""
    max_wait_s: float | None = None

    def __post_init__(self) -> None:
        if self.num_prompt_tokens < 1:
            raise RequestError(
                f"WaitingRequest {self.request_id!r}: num_prompt_tokens must be >= 1"
            )

    def wait_s(self, now_s: float) -> float:
        return now_s - self.arrival_s


@dataclass(frozen=True, slots=True)
class SessionView:
    """One conversation (a context that grows turn by turn).

    Attributes:
        session_id: its id.
        context: its context at the current version.
        block_hashes: the context's prefix blocks (what retention keeps).
        num_turns: turns completed so far.
        last_active_s: when its last turn finished.
        ended: True once the conversation is over (no further turn will come).
        gaps_s: its inter-turn intervals so far (a turn's completion to the next turn's
            arrival: the user's think time).
    """

    session_id: str
    context: ContextRef
    block_hashes: tuple[int, ...]
    num_turns: int
    last_active_s: float
    ended: bool = False
    gaps_s: tuple[float, ...] = ()

    @property
    def mean_gap_s(self) -> float | None:
        """Mean inter-turn interval so far (None before the second turn)."""
        return sum(self.gaps_s) / len(self.gaps_s) if self.gaps_s else None

    def __post_init__(self) -> None:
        if self.num_turns < 0:
            raise RequestError(f"SessionView {self.session_id!r}: num_turns must be >= 0")

    def idle_s(self, now_s: float) -> float:
        return max(0.0, now_s - self.last_active_s)
