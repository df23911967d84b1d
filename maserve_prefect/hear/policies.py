"""HEAR policies: pure decisions over waiting requests, residency and sessions.

One idea: a policy changes *when* and *how* a call runs, never *what* runs. Ordering policies map
`(waiting, residency, now_s)` to request ids in run order (for a harness that queues requests
itself); the same policies also produce what an engine applies — priorities, waiting
requirements —, and the others map views to controls or intents.
They import only `hear.*` and the engine seam (an import-contract test checks this), hold no
mutable state, and read no clock — `now_s` is an argument.

Ordering, as one lexicographic key per request (ties: arrival time, then request id):

- `Fcfs` — arrival order.
- `CacheAware` — a request is *hot* when its reusable prefix (leading blocks resident in GPU or
  CPU-host tiers) covers at least `hot_fraction` (default 50%) of its prompt. Hot requests go
  first, more reusable blocks first; cold ones keep arrival order. Residency may change between
  ordering and execution, so the engine side calls `recheck(request, residency_now)` before
  running the head of an older order; on False it orders again with its current residency, which
  puts the request back in its arrival slot among cold requests.
- `GuardW(W)` — a request that has waited W seconds (or its own `MaxWait`, whichever is less) is
  *protected*: protected requests run first, longest wait first, ahead of every unprotected
  request, hot or not. `compose` always applies guards before other keys, in whatever order
  the policies are passed, so protection cannot be bypassed.

Controls:

- `CacheAware.priority` / `GuardW.control` — the same two policies as the engine applies them
  (the HEAR paper's setting): a hot request's scheduling preference −(reusable blocks), refreshed
  by the harness from residency; a `MaxWait` requirement sent with each submission.
- `SessionAware` — after each completed turn, a continuation forecast p (depth and prior
  inter-turn intervals of completed conversations, `ContinuationModel`) told to the engine as a
  `ContinuationIntent`; the engine ranks evictions by p · e^(−idle / 400 s).
- `RoleModeSelection` — looks up a frozen, versioned `ModeMap` per request; `modemap.ModeLedger`
  records requested vs realized mode and fallbacks from outcomes.

Examples:
    >>> res = ResidencyView.of({1: Tier.GPU, 2: Tier.CPU}, block_size=10)
    >>> waiting = [WaitingRequest("old", 0.0, 40, (9, 9, 9, 9)),
    ...            WaitingRequest("hot", 5.0, 40, (1, 2, 3, 4))]
    >>> compose(CacheAware(), GuardW(30.0)).order(waiting, res, now_s=10.0)
    ['hot', 'old']
    >>> compose(CacheAware(), GuardW(30.0)).order(waiting, res, now_s=31.0)
    ['old', 'hot']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from maserve_prefect.errors import ConfigError
from maserve_prefect.hear.modemap import ModeMap
from maserve_prefect.protocol.controls import (
    ExecutionMode,
    Force,
    MaxWait,
    Tier,
)
from maserve_prefect.protocol.intents import ContinuationIntent, Prediction
from maserve_prefect.protocol.state import ResidencyView
from maserve_prefect.protocol.views import SessionView, WaitingRequest, fcfs_order

__all__ = [
    "CacheAware",
    "Composed",
    "ContinuationModel",
    "Fcfs",
    "GuardW",
    "OrderingPolicy",
    "ResidencyView",
    "RoleModeSelection",
    "SessionAware",
    "Tier",
    "WaitingRequest",
    "compose",
]

Key = tuple[float, ...]


class OrderingPolicy(Protocol):
    """A pure request-ordering policy. `precedence` 0 keys (guards) come before 1 in `compose`."""

    @property
    def name(self) -> str: ...

    @property
    def precedence(self) -> int: ...

    def key(self, request: WaitingRequest, residency: ResidencyView, now_s: float) -> Key: ...

    def order(
        self, waiting: Sequence[WaitingRequest], residency: ResidencyView, now_s: float
    ) -> list[str]: ...

    def recheck(self, request: WaitingRequest, residency: ResidencyView) -> bool: ...


def _order(
    policy: OrderingPolicy,
    waiting: Sequence[WaitingRequest],
    residency: ResidencyView,
    now_s: float,
) -> list[str]:
    by_key = sorted(
        fcfs_order(waiting, lambda w: w.arrival_s, lambda w: w.request_id),
        key=lambda w: policy.key(w, residency, now_s),
    )  # stable: FCFS within equal keys
    return [w.request_id for w in by_key]


class Fcfs:
    """First come, first served: arrival order (ties by request id)."""

    name: ClassVar[str] = "fcfs"
    precedence: ClassVar[int] = 1

    def key(self, request: WaitingRequest, residency: ResidencyView, now_s: float) -> Key:
        return ()

    def order(
        self, waiting: Sequence[WaitingRequest], residency: ResidencyView, now_s: float
    ) -> list[str]:
        return _order(self, waiting, residency, now_s)

    def recheck(self, request: WaitingRequest, residency: ResidencyView) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class CacheAware:
    """Hot requests first, most reusable blocks first (see the module docstring).

    Examples:
        >>> res = ResidencyView.of({1: Tier.GPU}, block_size=50)
        >>> CacheAware().is_hot(WaitingRequest("r", 0.0, 100, (1, 2)), res)
        True
    """

    name: ClassVar[str] = "cache_aware"
    precedence: ClassVar[int] = 1

    hot_fraction: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 < self.hot_fraction <= 1.0:
            raise ConfigError(
                f"CacheAware: hot_fraction must be in (0, 1], got {self.hot_fraction}"
            )

    def reusable_blocks(self, request: WaitingRequest, residency: ResidencyView) -> int:
        return residency.reusable_blocks(request.block_hashes)

    def is_hot(self, request: WaitingRequest, residency: ResidencyView) -> bool:
        blocks = self.reusable_blocks(request, residency)
        covered = min(blocks * residency.block_size, request.num_prompt_tokens)
        return covered >= self.hot_fraction * request.num_prompt_tokens

    def key(self, request: WaitingRequest, residency: ResidencyView, now_s: float) -> Key:
        if self.is_hot(request, residency):
            return (0.0, -float(self.reusable_blocks(request, residency)))
        return (1.0, 0.0)

    def order(
        self, waiting: Sequence[WaitingRequest], residency: ResidencyView, now_s: float
    ) -> list[str]:
        return _order(self, waiting, residency, now_s)

    def recheck(self, request: WaitingRequest, residency: ResidencyView) -> bool:
        """Engine side, before running: is `request` still hot under the current residency?"""
        return self.is_hot(request, residency)

    def priority(self, request: WaitingRequest, residency: ResidencyView) -> int | None:
        """The scheduling preference the engine applies (the paper's Appendix A.2): a hot
        request gets −(its reusable blocks), so hot ones run first, longest reusable prefix
        first; a cold one keeps the engine's default (None)."""
        if not self.is_hot(request, residency):
            return None
        return -self.reusable_blocks(request, residency)


@dataclass(frozen=True, slots=True)
class GuardW:
    """Protect requests that waited `wait_s` seconds (see the module docstring)."""

    name: ClassVar[str] = "guard_w"
    precedence: ClassVar[int] = 0

    wait_s: float

    def __post_init__(self) -> None:
        if not self.wait_s >= 0:
            raise ConfigError(f"GuardW: wait_s must be >= 0, got {self.wait_s}")

    def threshold_s(self, request: WaitingRequest) -> float:
        if request.max_wait_s is None:
            return self.wait_s
        return min(self.wait_s, request.max_wait_s)

    def is_protected(self, request: WaitingRequest, now_s: float) -> bool:
        return request.wait_s(now_s) >= self.threshold_s(request)

    def key(self, request: WaitingRequest, residency: ResidencyView, now_s: float) -> Key:
        if self.is_protected(request, now_s):
            return (0.0, -request.wait_s(now_s))
        return (1.0, 0.0)

    def order(
        self, waiting: Sequence[WaitingRequest], residency: ResidencyView, now_s: float
    ) -> list[str]:
        return _order(self, waiting, residency, now_s)

    def recheck(self, request: WaitingRequest, residency: ResidencyView) -> bool:
        return True  # protection depends on time only, and time does not run backwards

    def control(self) -> MaxWait:
        """What the harness sends with a submission: a waiting-time *requirement* the engine
        enforces (not bypassed, not preempted once it has waited `wait_s`)."""
        return MaxWait(self.wait_s, force=Force.REQUIREMENT)


@dataclass(frozen=True, slots=True)
class Composed:
    """Policies applied as one lexicographic key, guards (precedence 0) first."""

    precedence: ClassVar[int] = 0

    policies: tuple[OrderingPolicy, ...]

    @property
    def name(self) -> str:
        return "+".join(p.name for p in self.policies)

    def key(self, request: WaitingRequest, residency: ResidencyView, now_s: float) -> Key:
        return tuple(x for p in self.policies for x in p.key(request, residency, now_s))

    def order(
        self, waiting: Sequence[WaitingRequest], residency: ResidencyView, now_s: float
    ) -> list[str]:
        return _order(self, waiting, residency, now_s)

    def recheck(self, request: WaitingRequest, residency: ResidencyView) -> bool:
        return all(p.recheck(request, residency) for p in self.policies)


def compose(*policies: OrderingPolicy) -> Composed:
    """Combine ordering policies; guards always outrank the rest, whatever the argument order.

    Raises:
        ConfigError: no policy given.
    """
    if not policies:
        raise ConfigError("compose() needs at least one policy")
    flat: list[OrderingPolicy] = []
    for p in policies:
        flat.extend(p.policies if isinstance(p, Composed) else (p,))
    return Composed(tuple(sorted(flat, key=lambda p: p.precedence)))


# ---------------------------------------------------------------------------------------------
# session-aware continuation


@dataclass(frozen=True, slots=True)
class ContinuationModel:
    """P(another turn | depth, prior inter-turn intervals), from *completed* conversations only.

    A completed conversation contributes its depth (turns) and its mean inter-turn interval.
    Intervals split conversations at the median of those means: a session that has shown
    intervals is compared with completed ones on its side of the split (users who come back
    quickly are told apart from those who come back slowly); a session without an interval yet
    (after its first turn) with all of them. Among the comparable ones that reached depth k,
    P(next | k) = (those that went past k + 1) / (those that reached k + 2) — the Laplace rule, so
    no data gives 0.5 and a few conversations cannot give certainty. The open session's own future
    is never used (the HEAR paper: "does not use future information from the current replay").

    Examples:
        >>> from maserve_prefect.protocol.subjects import ContextRef
        >>> v = lambda n, gaps, ended=True: SessionView(
        ...     f"s{n}{gaps}", ContextRef("c"), (), n, 0.0, ended, tuple(gaps))
        >>> done = [v(1, ()), v(3, (1.0, 1.0)), v(4, (1.0, 2.0, 1.0)), v(2, (30.0,))]
        >>> model = ContinuationModel.fit(done)
        >>> model.p_return(v(2, (1.0,), ended=False))  # quick: both quick ones went past 2
        0.75
        >>> model.p_return(v(2, (40.0,), ended=False))  # slow: the slow one stopped at 2
        0.3333333333333333
    """

    completed: tuple[tuple[int, float | None], ...]  # (depth, mean interval) per conversation
    split_s: float | None  # median mean interval of completed multi-turn conversations

    @classmethod
    def fit(cls, sessions: Sequence[SessionView]) -> ContinuationModel:
        """From `sessions`, ignoring every one that has not completed."""
        done = tuple((s.num_turns, s.mean_gap_s) for s in sessions if s.ended)
        means = sorted(g for _, g in done if g is not None)
        split = means[(len(means) - 1) // 2] if means else None
        return cls(done, split)

    def p_return(self, session: SessionView) -> float:
        """The continuation estimate of an open session after `session.num_turns` turns."""
        k, gap = session.num_turns, session.mean_gap_s
        if gap is None or self.split_s is None:
            peers = [d for d, _ in self.completed]
        else:
            quick = gap <= self.split_s
            peers = [d for d, g in self.completed if g is not None and (g <= self.split_s) == quick]
        reached = sum(1 for d in peers if d >= k)
        longer = sum(1 for d in peers if d > k)
        return (longer + 1) / (reached + 2)


@dataclass(frozen=True, slots=True)
class SessionAware:
    """The HEAR paper's Session-Aware: a continuation forecast told as an intent, never a control.

    After each completed turn the harness tells the engine how likely the conversation is to
    return (`ContinuationModel`, fitted on completed conversations), as a `ContinuationIntent`
    marked as a prediction. The engine folds it with the recency of that completion into its
    own eviction ranking, r = p · e^(−idle / 400 s) (Appendix A.2; the simulator:
    `engines.sim.hear.side.SimHear.inform`). There is no release threshold and nothing is
    retained on request.

    Examples:
        >>> from maserve_prefect.protocol.subjects import ContextRef
        >>> s = SessionView("s", ContextRef("s", 2), (7, 8), 2, 10.0, gaps_s=(4.0,))
        >>> intent = SessionAware().intent(s, ContinuationModel((), None))
        >>> intent.p_return.value, intent.p_return.is_prediction, intent.block_hashes
        (0.5, True, (7, 8))
    """

    source: str = "continuation-depth-interval"
    name: ClassVar[str] = "session_aware"

    def intent(self, session: SessionView, model: ContinuationModel) -> ContinuationIntent:
        p = model.p_return(session)
        return ContinuationIntent(session.context, Prediction(p, self.source), session.block_hashes)


# ---------------------------------------------------------------------------------------------
# role -> mode selection


@dataclass(frozen=True, slots=True)
class RoleModeSelection:
    """Per-request mode from a frozen `ModeMap` (see `hear.modemap`).

    Examples:
        >>> sel = RoleModeSelection(ModeMap.of("v1", {"critic": "eager"}, default="default"))
        >>> sel.lookup("critic"), sel.control("planner").mode
        ('eager', 'default')
    """

    mapping: ModeMap
    force: Force = Force.PREFERENCE
    fallback: tuple[str, ...] = ()
    name: ClassVar[str] = "role_mode"

    def lookup(self, role: str) -> str:
        return self.mapping.lookup(role)

    def control(self, role: str) -> ExecutionMode:
        """The `ExecutionMode` control to send for a request of `role`."""
        return ExecutionMode(self.lookup(role), force=self.force, fallback=self.fallback)
