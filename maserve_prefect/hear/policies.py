"""HEAR policies: pure decisions over waiting requests, residency and sessions.

One idea: a policy changes *when* and *how* a call runs, never *what* runs. Ordering policies map
`(waiting, residency, now_s)` to request ids in run order; the others map views to controls.
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

- `SessionRetention` — retention priority = P(next turn | turns so far) × 0.5^(idle / half-life).
  The continuation estimate comes from *ended* sessions only (an open session's final length is
  unknown; counting it would bias the estimate toward short sessions). Open sessions at or above
  `release_below` get `CacheRetain`; ended ones and those below get `CacheRelease` — input for
  the engine's eviction hook. The retain carries `eviction_key`, log2 P(next) + last active /
  half-life: the decay shrinks every session's priority by the same factor as time passes, so
  this key orders sessions exactly as their decayed priorities do at any later instant, and the
  engine (which only compares keys) evicts by the decayed priority without being re-sent.
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

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from maserve_prefect.errors import ConfigError
from maserve_prefect.hear.modemap import ModeMap
from maserve_prefect.protocol.controls import (
    CacheRelease,
    CacheRetain,
    Control,
    ExecutionMode,
    Force,
    Priority,
    Tier,
)
from maserve_prefect.protocol.state import ResidencyView
from maserve_prefect.protocol.views import SessionView, WaitingRequest, fcfs_order

__all__ = [
    "CacheAware",
    "Composed",
    "ContinuationEstimator",
    "Fcfs",
    "GuardW",
    "OrderingPolicy",
    "ResidencyView",
    "RoleModeSelection",
    "SessionRetention",
    "Tier",
    "WaitingRequest",
    "compose",
    "priority_controls",
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


def priority_controls(order: Sequence[str], force: Force = Force.PREFERENCE) -> dict[str, Priority]:
    """An order as per-request `Priority` controls (rank 0 first), for priority engines."""
    return {rid: Priority(rank, force=force) for rank, rid in enumerate(order)}


# ---------------------------------------------------------------------------------------------
# session-aware retention


@dataclass(frozen=True, slots=True)
class ContinuationEstimator:
    """P(next turn | turns so far), from the turn counts of *ended* sessions only.

    With `n_reached` ended sessions that had at least k turns and `n_longer` that had more than
    k, P(next | k) = (n_longer + 1) / (n_reached + 2) — the Laplace rule, so no data gives 0.5
    and a few sessions cannot give certainty.

    Examples:
        >>> from maserve_prefect.protocol.subjects import ContextRef
        >>> done = [SessionView(f"s{n}", ContextRef(f"s{n}"), (1,), n, 0.0, ended=True)
        ...         for n in (1, 2, 2, 3)]
        >>> ContinuationEstimator.from_sessions(done).p_next(2)
        0.4
    """

    ended_turns: tuple[int, ...]  # sorted

    @classmethod
    def from_sessions(cls, sessions: Sequence[SessionView]) -> ContinuationEstimator:
        """Fit from `sessions`, ignoring every session that has not ended."""
        return cls(tuple(sorted(s.num_turns for s in sessions if s.ended)))

    def p_next(self, turns_so_far: int) -> float:
        n_reached = len(self.ended_turns) - bisect.bisect_left(self.ended_turns, turns_so_far)
        n_longer = len(self.ended_turns) - bisect.bisect_right(self.ended_turns, turns_so_far)
        return (n_longer + 1) / (n_reached + 2)


@dataclass(frozen=True, slots=True)
class SessionRetention:
    """Retain likely-to-continue sessions' KV, release the rest (see the module docstring).

    Attributes:
        half_life_s: idle time that halves a session's retention priority. The default, 60 s,
            spans the tool calls and sub-agent runs that separate agent turns; a session idle
            for five minutes keeps ~3% of its priority.
        release_below: open sessions whose priority falls under this get `CacheRelease`.
        tier: the tier to retain in.
        force: the force of the produced controls (retention is normally a preference).
    """

    half_life_s: float = 60.0
    release_below: float = 0.05
    tier: Tier = Tier.GPU
    force: Force = Force.PREFERENCE
    name: ClassVar[str] = "session_retention"

    def __post_init__(self) -> None:
        if not self.half_life_s > 0:
            raise ConfigError(f"SessionRetention: half_life_s must be > 0, got {self.half_life_s}")

    def retention_priority(
        self, session: SessionView, estimator: ContinuationEstimator, now_s: float
    ) -> float:
        decay = 0.5 ** (session.idle_s(now_s) / self.half_life_s)
        return estimator.p_next(session.num_turns) * decay

    def eviction_key(self, session: SessionView, estimator: ContinuationEstimator) -> float:
        """log2 of the retention priority at any time t, plus t / half-life: a key that does
        not change as the session idles, ordered as the decayed priorities (module docstring).

        Examples:
            >>> from maserve_prefect.protocol.subjects import ContextRef
            >>> pol, est = SessionRetention(half_life_s=60.0), ContinuationEstimator((2, 5, 9))
            >>> a = SessionView("a", ContextRef("a"), (1,), 1, last_active_s=0.0)
            >>> b = SessionView("b", ContextRef("b"), (2,), 4, last_active_s=100.0)
            >>> pol.retention_priority(a, est, 130.0) > pol.retention_priority(b, est, 130.0)
            False
            >>> pol.eviction_key(a, est) > pol.eviction_key(b, est)
            False
        """
        return math.log2(estimator.p_next(session.num_turns)) + (
            session.last_active_s / self.half_life_s
        )

    def controls(
        self,
        sessions: Sequence[SessionView],
        now_s: float,
        history: Sequence[SessionView] | None = None,
        estimator: ContinuationEstimator | None = None,
    ) -> list[Control]:
        """Retain / release controls for `sessions`: retains by falling priority, then releases.

        Args:
            sessions: the sessions whose KV is in question (open and ended).
            now_s: the current time (policy clock).
            history: sessions to estimate continuation from (default: `sessions`); only the
                ended ones count.
            estimator: the estimate itself, already fitted from ended sessions (a harness
                keeping it as sessions end); `history` is then ignored.
        """
        est = estimator
        if est is None:
            est = ContinuationEstimator.from_sessions(sessions if history is None else history)
        keep: list[tuple[float, str, Control]] = []
        drop: list[Control] = []
        for s in sorted(sessions, key=lambda s: s.session_id):
            p = 0.0 if s.ended else self.retention_priority(s, est, now_s)
            if s.ended or p < self.release_below or not s.block_hashes:
                drop.append(CacheRelease(s.context, s.block_hashes, force=self.force))
            else:
                key = self.eviction_key(s, est)
                retain = CacheRetain(
                    s.context, s.block_hashes, key, tier=self.tier, force=self.force
                )
                keep.append((-p, s.session_id, retain))
        return [c for _, _, c in sorted(keep, key=lambda t: t[:2])] + drop


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
