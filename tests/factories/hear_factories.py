"""Factories for HEAR tests: engines, capabilities, waiting requests, sessions."""

from __future__ import annotations

from collections.abc import Sequence

from maserve_prefect.protocol.capabilities import Capabilities
from maserve_prefect.protocol.controls import CacheOp, Control, ExecutionMode, Priority, Tier
from maserve_prefect.protocol.fake import ReferenceEngine
from maserve_prefect.protocol.intents import Intent
from maserve_prefect.protocol.outcomes import Acceptance, Ticket
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.state import EngineState
from maserve_prefect.protocol.subjects import ContextRef
from maserve_prefect.protocol.views import SessionView, WaitingRequest


def make_engine(
    modes: Sequence[str] = ("default", "eager"),
    tiers: dict[Tier, int] | None = None,
    cache_ops: Sequence[CacheOp] = (CacheOp.PREPARE, CacheOp.RETAIN, CacheOp.RELEASE),
) -> ReferenceEngine:
    return ReferenceEngine("ref-0", modes=modes, tiers=tiers or {Tier.GPU: 16}, cache_ops=cache_ops)


def seam_caps(
    control_types: tuple[type[Control], ...] = (ExecutionMode, Priority),
    modes: tuple[str, ...] = ("default", "eager"),
    prefix_caching: bool = True,
) -> Capabilities:
    return Capabilities(
        control_types=control_types,
        accepts_token_ids=True,
        length_lock=True,
        priority_scheduling=Priority in control_types,
        prefix_caching=prefix_caching,
        kv_events=False,
        sleep_levels=(),
        modes=modes,
    )


def waiting(
    rid: str,
    arrival_s: float,
    num_prompt_tokens: int = 100,
    blocks: Sequence[int] = (),
    max_wait_s: float | None = None,
) -> WaitingRequest:
    return WaitingRequest(rid, arrival_s, num_prompt_tokens, tuple(blocks), max_wait_s=max_wait_s)


def session(
    sid: str,
    num_turns: int,
    ended: bool,
    last_active_s: float = 0.0,
    blocks: Sequence[int] = (1,),
    gaps_s: Sequence[float] = (),
) -> SessionView:
    return SessionView(
        sid, ContextRef(sid, num_turns), tuple(blocks), num_turns, last_active_s, ended,
        tuple(gaps_s),
    )  # fmt: skip


class FakeReplica:
    """A seam `Replica` that records what reaches it and accepts everything."""

    name = "fake-0"
    deployment = "m"

    def __init__(self, caps: Capabilities) -> None:
        self._caps = caps
        self.submitted: list[tuple[Request, tuple[Control, ...]]] = []
        self.intents: list[Intent] = []

    def capabilities(self) -> Capabilities:
        return self._caps

    def submit(self, request: Request, controls: Sequence[Control] = ()) -> Ticket:
        self.submitted.append((request, tuple(controls)))
        return Ticket(request.request_id, Acceptance.ACCEPTED)

    def inform(self, intent: Intent) -> None:
        self.intents.append(intent)

    def state(self) -> EngineState:
        return EngineState(self.name, self.deployment, "running", 0, 0, 0.0, 10, 10, 16, {})
