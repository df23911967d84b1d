"""The force rules, enforced in one place: `resolve(controls, capabilities) -> Resolution`.

One idea: every engine side (simulator, OpenAI backend, vLLM pool, the reference engine) calls
`resolve` on the controls it was sent and applies `Resolution.honoured` — nothing else — so the
HEAR rules hold by construction:

- *an intent never triggers an action*: intents are not controls; passing one here raises
  (`RequestError`) — they go to `Channel.inform` / `Replica.inform`;
- *state never reserves*: passing a state report or residency view as a control raises too; a
  resident prefix stays evictable until a `CacheRetain` / `CachePrepare` control is honoured;
- *a preference never overrides a requirement*: requirements are resolved first and claim their
  slots (the priority, the mode, a block's residency, ...); a preference that conflicts with a
  claimed slot is dropped and the drop is noted (among preferences, the first listed wins);
- *an unsatisfiable requirement is rejected or falls back explicitly*: a requirement the engine
  cannot honour (unsupported, or in conflict with an earlier requirement) is replaced by the
  first of its allowed fallbacks that works — recorded as a `FallbackUsed` — or else named in
  `Resolution.unsatisfied`, which makes the answer UNSUPPORTED;
- *acceptance is not completion*: `Resolution.outcome` yields `Accepted` or `Unsupported`, never
  `Completed` (see `protocol.outcomes`).

A used fallback is applied with the force of the control it stands in for.

Examples:
    >>> from maserve_prefect.protocol.capabilities import Capabilities
    >>> caps = Capabilities((ExecutionMode, Priority), True, True, True, True, False, (),
    ...                     ("default", "eager"))
    >>> res = resolve([Priority(5), Priority(1, force=Force.REQUIREMENT),
    ...                ExecutionMode("fast", force=Force.REQUIREMENT, fallback=("eager",))], caps)
    >>> [c.value for c in res.honoured_of(Priority)], res.realized_mode("default")
    ([1], 'eager')
    >>> res.acceptance.value, len(res.dropped), len(res.fallbacks)
    ('accepted', 1, 1)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from maserve_prefect.errors import RequestError
from maserve_prefect.protocol.capabilities import (
    Capabilities,
    HearCapabilities,
    alternatives,
    support_reason,
)
from maserve_prefect.protocol.controls import (
    CachePrepare,
    CacheRelease,
    CacheRetain,
    Control,
    ExecutionMode,
    Force,
    MaxWait,
    OrderingKey,
    Priority,
)
from maserve_prefect.protocol.intents import Intent, IntentMessage
from maserve_prefect.protocol.outcomes import (
    Acceptance,
    Accepted,
    FallbackUsed,
    Realization,
    Unsupported,
)
from maserve_prefect.protocol.state import ResidencyView, StateReport
from maserve_prefect.protocol.subjects import Subject

C = TypeVar("C", bound=Control)
Claim = tuple[Hashable, Hashable]  # (slot, value): two controls conflict on a slot, value differs


@dataclass(frozen=True, slots=True)
class Dropped:
    """A preference not honoured, and why (unsupported, or it conflicted with a requirement)."""

    control: Control
    reason: str

    def note(self) -> str:
        return f"dropped preference {self.control!r}: {self.reason}"


@dataclass(frozen=True, slots=True)
class Unsatisfied:
    """A requirement neither it nor any allowed fallback could satisfy."""

    control: Control
    reason: str


@dataclass(frozen=True, slots=True)
class Resolution:
    """What to apply (`honoured`, fallbacks substituted) and the record of everything else."""

    honoured: tuple[Control, ...]
    fallbacks: tuple[FallbackUsed, ...] = ()
    dropped: tuple[Dropped, ...] = ()
    unsatisfied: tuple[Unsatisfied, ...] = ()

    @property
    def acceptance(self) -> Acceptance:
        return Acceptance.UNSUPPORTED if self.unsatisfied else Acceptance.ACCEPTED

    @property
    def reason(self) -> str:
        """Names every unsatisfied requirement ("" when there is none)."""
        return "; ".join(
            f"required {u.control!r} unsatisfied: {u.reason}" for u in self.unsatisfied
        )

    def notes(self) -> tuple[str, ...]:
        return tuple(f.note() for f in self.fallbacks) + tuple(d.note() for d in self.dropped)

    def honoured_of(self, kind: type[C]) -> tuple[C, ...]:
        """The honoured controls of one type, in resolution order."""
        return tuple(c for c in self.honoured if isinstance(c, kind))

    def realized_mode(self, default: str) -> str:
        """The honoured execution mode, or `default` when none was asked for."""
        modes = self.honoured_of(ExecutionMode)
        return modes[0].mode if modes else default

    def outcome(self, subject: Subject, at_s: float | None, mode: str) -> Accepted | Unsupported:
        """The immediate answer: UNSUPPORTED naming the requirements, or ACCEPTED (not done)."""
        if self.unsatisfied:
            return Unsupported(subject, self.reason, tuple(u.control for u in self.unsatisfied))
        return Accepted(subject, at_s, Realization(mode, self.fallbacks, self.notes()))


def resolve(
    controls: Sequence[Control], capabilities: HearCapabilities | Capabilities
) -> Resolution:
    """Apply the force rules (module docstring) to `controls` against one engine's capabilities.

    Args:
        controls: the controls sent with one submission (or one control call).
        capabilities: the engine's; seam `Capabilities` are lifted with `from_engine`.

    Raises:
        RequestError: an intent or a state message was passed as a control, or a fallback entry
            is malformed.
    """
    caps = (
        capabilities
        if isinstance(capabilities, HearCapabilities)
        else HearCapabilities.from_engine(capabilities)
    )
    for c in controls:
        _check_is_control(c)
    ordered = [c for c in controls if c.force is Force.REQUIREMENT]
    ordered += [c for c in controls if c.force is not Force.REQUIREMENT]
    claimed: dict[Hashable, tuple[Hashable, Control]] = {}
    honoured: list[Control] = []
    fallbacks: list[FallbackUsed] = []
    dropped: list[Dropped] = []
    unsatisfied: list[Unsatisfied] = []
    for c in ordered:
        reasons: list[str] = []
        chosen: Control | None = None
        for i, alt in enumerate(alternatives(c)):
            why = support_reason(alt, caps) or _conflict(alt, claimed)
            if not why:
                chosen = alt if i == 0 else dataclasses.replace(alt, force=c.force)
                break
            reasons.append(why if i == 0 else f"fallback {alt!r}: {why}")
        if chosen is None:
            if c.force is Force.REQUIREMENT:
                unsatisfied.append(Unsatisfied(c, "; ".join(reasons)))
            else:
                dropped.append(Dropped(c, "; ".join(reasons)))
            continue
        if chosen is not c:
            fallbacks.append(FallbackUsed(c, chosen))
        for slot, value in _claims(chosen):
            claimed[slot] = (value, c)
        honoured.append(chosen)
    return Resolution(tuple(honoured), tuple(fallbacks), tuple(dropped), tuple(unsatisfied))


def _check_is_control(c: object) -> None:
    if isinstance(c, Intent | IntentMessage):
        raise RequestError(
            f"{type(c).__name__} is an intent, not a control: intents never trigger an action; "
            "send it with Channel.inform / Replica.inform"
        )
    if isinstance(c, StateReport | ResidencyView):
        raise RequestError(
            f"{type(c).__name__} is engine state, not a control: state never reserves; "
            "send CacheRetain or CachePrepare to keep blocks resident"
        )
    if not isinstance(c, Control):
        raise RequestError(f"{c!r} is not a HEAR control (subclass protocol.engine.Control)")


def _conflict(control: Control, claimed: dict[Hashable, tuple[Hashable, Control]]) -> str:
    for slot, value in _claims(control):
        held = claimed.get(slot)
        if held is not None and held[0] != value:
            other = held[1]
            return f"conflicts with {other.force.name.lower()} {other!r}"
    return ""


def _claims(c: Control) -> tuple[Claim, ...]:
    """The slots a control sets, with the value it sets them to."""
    if isinstance(c, Priority):
        return ((("priority",), c.value),)
    if isinstance(c, OrderingKey):
        return ((("ordering",), c.key),)
    if isinstance(c, ExecutionMode):
        return ((("mode",), c.mode),)
    if isinstance(c, MaxWait):
        return ((("max_wait",), c.max_wait_s),)
    if isinstance(c, CacheRetain):
        keep: list[Claim] = [(("residency", c.subject.key()), "keep")]
        for h in c.block_hashes:
            keep += [(("residency", h), "keep"), (("retention", h), (c.retention_priority, c.tier))]
        return tuple(keep)
    if isinstance(c, CachePrepare):
        prep: list[Claim] = [(("residency", c.subject.key()), "keep")]
        for h in c.block_hashes:
            prep += [(("residency", h), "keep"), (("prepare", h), c.tier)]
        return tuple(prep)
    if isinstance(c, CacheRelease):
        if not c.block_hashes:
            return ((("residency", c.subject.key()), "drop"),)
        return tuple((("residency", h), "drop") for h in c.block_hashes)
    # a control type HEAR does not know: one slot per type, valued by its fields
    fields = tuple(
        getattr(c, f.name) for f in dataclasses.fields(c) if f.name not in ("force", "fallback")
    )
    return (((type(c).__name__,), repr(fields)),)
