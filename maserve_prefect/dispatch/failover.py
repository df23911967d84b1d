"""Failover: a unit whose replica stopped answering goes back to the ready set, not to its caller.

One idea: when a replica is one of several endpoints of a deployment (a fleet), a unit that
failed *because its endpoint went away* is not a failed op but a failed attempt. The dispatcher
asks its `Failover` (the fleet, which keeps each endpoint's health) whether to place the unit
again; if so, the unit is ready once more — the same plan places it on a live replica — and the
attempts it made so far travel with it. When it finally ends, its outcome carries every attempt,
numbered in order, so the ledger records a failed attempt per lost endpoint and the final one
as attempt n + 1 (the task runner's harness writes `attempts[:-1]` as failed attempts).

Pure helpers here (`lost_attempts`, `with_attempts`); the decision is the fleet's.

Examples:
    >>> from maserve_prefect.protocol.outcomes import Attempt, Outcome, OutcomeStatus
    >>> out = Outcome("op", OutcomeStatus.FAILED, 5, 0, 0, 0, "", 1.0, None, None, 2.0,
    ...               error="connection error", attempts=(Attempt(1, 1.0, 2.0, "refused"),))
    >>> carried = lost_attempts(out, "main@a:1")
    >>> carried[0].error
    'main@a:1: refused'
    >>> ok = Outcome("op", OutcomeStatus.COMPLETED, 5, 3, 0, 0, "", 3.0, None, 3.1, 3.5,
    ...              attempts=(Attempt(1, 3.0, 3.5),))
    >>> [(a.number, a.error) for a in with_attempts(ok, carried).attempts]
    [(1, 'main@a:1: refused'), (2, None)]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from maserve_prefect.protocol.outcomes import Attempt, Outcome


class Failover(Protocol):
    """Whether a unit that ended badly on a replica is placed again (see the module docstring)."""

    def reroute(self, replica: str, outcome: Outcome, num_reroutes: int) -> bool:
        """True to place the unit again: `outcome` ended it on `replica` (failed, aborted, or
        refused at submission) after `num_reroutes` earlier re-placements."""
        ...

    def no_live_reason(self, deployment: str) -> str | None:
        """A one-line reason when no live replica serves `deployment` (None: say it generically)."""
        ...


def lost_attempts(outcome: Outcome, replica: str) -> tuple[Attempt, ...]:
    """The attempts an outcome that ended on `replica` leaves to carry (one, when the engine
    recorded none: a unit aborted before it ran still made an attempt there); errors name the
    replica."""
    made = outcome.attempts or (
        Attempt(1, outcome.arrival_s, outcome.finish_s, outcome.error or outcome.status.value),
    )
    return tuple(
        dataclasses.replace(a, error=f"{replica}: {a.error or outcome.status.value}") for a in made
    )


def with_attempts(outcome: Outcome, carried: Sequence[Attempt]) -> Outcome:
    """`outcome` with `carried` attempts before its own, all numbered from 1 (an outcome without
    attempts of its own — a unit failed before it ran again — adds one for itself)."""
    if not carried:
        return outcome
    own = outcome.attempts or (
        Attempt(1, outcome.arrival_s, outcome.finish_s, outcome.error or outcome.status.value),
    )
    attempts = [*carried, *own]
    numbered = tuple(dataclasses.replace(a, number=i) for i, a in enumerate(attempts, 1))
    return dataclasses.replace(outcome, attempts=numbered)
