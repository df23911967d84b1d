"""The two HEAR channels between a harness and one replica: intents and controls.

One idea: the channels are separate so an intent cannot turn into an action. `Channel.inform`
sends an intent (returns nothing); `Channel.submit` sends a request with its controls after
`usable` has filtered them against the engine's capabilities. A requirement the engine cannot
honour, even through an allowed fallback, is answered UNSUPPORTED right here — named, never
dropped in silence. Engine sides keep what `inform` brings in an `IntentLog`, which nothing that
schedules reads.

Examples:
    >>> from maserve_prefect.protocol.messages import RequestRef, RoleIntent
    >>> log = IntentLog()
    >>> log.inform(RoleIntent(RequestRef("r1"), "planner"))
    >>> len(log), log.records[0].role
    (1, 'planner')
"""

from __future__ import annotations

from collections.abc import Sequence

from maserve_prefect.errors import RequestError
from maserve_prefect.protocol.capabilities import HearCapabilities, usable
from maserve_prefect.protocol.controls import Control, Force
from maserve_prefect.protocol.engine import Replica
from maserve_prefect.protocol.intents import IntentMessage, encode_intent
from maserve_prefect.protocol.outcomes import Acceptance, Ticket
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.state import EngineState


class IntentLog:
    """Engine side: the intents received, in order. Append-only; scheduling never reads it."""

    __slots__ = ("_records",)

    def __init__(self) -> None:
        self._records: list[IntentMessage] = []

    def inform(self, intent: IntentMessage) -> None:
        """Record `intent`. Returns nothing and changes nothing else.

        Raises:
            RequestError: `intent` is not an intent message (e.g. a control).
        """
        encode_intent(intent)  # type check with a helpful message
        self._records.append(intent)

    @property
    def records(self) -> tuple[IntentMessage, ...]:
        return tuple(self._records)

    def __len__(self) -> int:
        return len(self._records)


class Channel:
    """Harness side of HEAR for one replica.

    Args:
        replica: any engine-seam `Replica`.
        capabilities: the replica's HEAR capabilities when it declares extras (cache controls,
            KV tiers, waiting requirements); by default derived from `replica.capabilities()`.
    """

    def __init__(self, replica: Replica, capabilities: HearCapabilities | None = None) -> None:
        self.replica = replica
        self.capabilities = capabilities or HearCapabilities.from_engine(replica.capabilities())

    def inform(self, intent: IntentMessage) -> None:
        """Send an intent on the intent channel; it never causes an action."""
        self.replica.inform(encode_intent(intent))

    def submit(self, request: Request, controls: Sequence[Control] = ()) -> Ticket:
        """Send `request` with the controls the engine can honour.

        Withheld preferences are noted on the ticket; a withheld requirement makes the ticket
        UNSUPPORTED without contacting the engine.

        Raises:
            RequestError: a control's fallback entry is malformed.
        """
        for c in controls:
            if not isinstance(c, Control):
                raise RequestError(
                    f"request {request.request_id!r}: {type(c).__name__} is not a control; "
                    "send intents with Channel.inform"
                )
        u = usable(controls, self.capabilities)
        if not u.ok:
            reason = "; ".join(
                f"required {c!r} unsupported: {why}"
                for c, why in u.withheld
                if c.force is Force.REQUIREMENT
            )
            return Ticket(request.request_id, Acceptance.UNSUPPORTED, reason)
        ticket = self.replica.submit(request, u.send)
        if u.withheld:
            notes = tuple(f"withheld preference {c!r}: {why}" for c, why in u.withheld)
            ticket.notes = ticket.notes + notes
        return ticket

    def state(self) -> EngineState:
        return self.replica.state()
