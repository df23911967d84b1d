"""Glue between HEAR policies (`hear/`) and a session replay on simulated engines (`replay/`).

One idea: the HEAR paper's policies act *through the engine*. The harness submits every turn
as soon as it has it and attaches what the policies say; the engine's own scheduler decides
what runs. These adapters translate policy output into protocol messages and time every
translation as control-plane overhead (`hear.overhead.OverheadRecorder`, the paper's Table 7),
so the cost of the protocol is measured where it is paid. `bench.hear.arms` wires them onto
one replay per policy arm.

- `EngineOrdering` — Cache-Aware and Guard-W (Appendix A.2). At submission: a Guard sends
  `MaxWait(W)` as a *requirement* (the engine protects the request once it has waited W: not
  bypassed, not preempted); Cache-Aware sends the request's scheduling *preference*, a
  `Priority` of −(reusable blocks) if the request is hot, none if cold. Every `refresh_s` seconds
  while turns wait, it brings its `ResidencyMirror` up to date from the replicas' KV events
  (one `KV_STATE_UPDATE`: the changes since the last refresh) and sends `SimReplica.update` for
  every submitted request whose priority changed (one `SCHEDULING_DECISION`): residency moves as
  other requests run and evict. An update the engine answers "already runs" ends the request's
  refreshes (its place in the queue is moot). Block hashes are the *engine's*
  (`engines.sim.hear.side.prompt_block_hashes`, memoized per request), not the workload's.
- `ContinuationHook` — Session-Aware: after each completed turn, one `SessionView` per session
  (depth, prior inter-turn intervals) and one `ContinuationIntent` to the replica that served
  the turn (`SimReplica.inform`, one `OUTCOME_REPORT`), its forecast from a `ContinuationModel`
  fitted on completed conversations only. A conversation counts as completed when its last
  turn completes (a user closing the chat), after its own last forecast was told: no forecast
  uses the future of its own session. No control, no release threshold.
- `ModeReplica` — a replica proxy that sends each request's role's `ExecutionMode` (from
  `RoleModeSelection`, one `MODE_LOOKUP`) with `submit` and records requested vs realized mode
  (`hear.modemap.ModeRecord`) from the outcome.

Examples:
    >>> EngineOrdering(None, None, []).controls_at_submit  # FCFS: nothing to send
    False
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from maserve_prefect.bench.hear.residency_mirror import ResidencyMirror
from maserve_prefect.engines.sim.hear.side import ResidencyFeed, prompt_block_hashes
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.errors import ConfigError
from maserve_prefect.hear.modemap import ModeRecord
from maserve_prefect.hear.overhead import Op, OverheadRecorder
from maserve_prefect.hear.policies import (
    CacheAware,
    ContinuationModel,
    GuardW,
    RoleModeSelection,
    SessionAware,
)
from maserve_prefect.protocol.controls import Control, Priority
from maserve_prefect.protocol.outcomes import Outcome, Ticket
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.state import ResidencyView
from maserve_prefect.protocol.subjects import ContextRef
from maserve_prefect.protocol.views import SessionView, WaitingRequest
from maserve_prefect.replay.session_results import TurnResult
from maserve_prefect.replay.sessions import QueuedTurn
from maserve_prefect.workloads.sessions import Session, Turn

__all__ = [
    "DEFAULT_PRIORITY",
    "ContinuationHook",
    "EngineOrdering",
    "ModeReplica",
    "engine_hashes",
    "role_of",
]

DEFAULT_PRIORITY = 0
"""The engine's default priority: what a cold request keeps (vLLM's default)."""


def role_of(session_id: str) -> str:
    """The agent role of a session: its id's prefix before the first '-' ("main-003" -> "main")."""
    return session_id.split("-", 1)[0]


def engine_hashes(num_prompt_tokens: int, hashes: tuple[int, ...], block_size: int,
                  engine_block_size: int) -> tuple[int, ...]:  # fmt: skip
    """The engine block hashes of a prompt described by workload block hashes."""
    req = Request(
        "probe",
        "",
        num_prompt_tokens=num_prompt_tokens,
        prefix_block_hashes=hashes,
        prefix_block_size=block_size if hashes else 0,
        max_tokens=1,
    )
    return prompt_block_hashes(req, engine_block_size)


class EngineOrdering:
    """Cache-Aware priorities and Guard-W requirements sent to the engine (module docstring).

    Args:
        cache_aware: the Cache-Aware policy (None: send no priorities).
        guard: the Guard-W policy (None: send no waiting requirement).
        replicas: the replicas turns go to (their residency is what Cache-Aware reads).
        recorder: where control-plane time goes (a fresh one by default).
        refresh_s: seconds between priority refreshes from residency.
    """

    def __init__(
        self,
        cache_aware: CacheAware | None,
        guard: GuardW | None,
        replicas: Sequence[SimReplica],
        recorder: OverheadRecorder | None = None,
        refresh_s: float = 1.0,
    ) -> None:
        if not refresh_s > 0:
            raise ConfigError(f"EngineOrdering: refresh_s must be > 0, got {refresh_s}")
        self.cache_aware = cache_aware
        self.guard = guard
        self.replicas = {r.name: r for r in replicas}
        self.recorder = recorder if recorder is not None else OverheadRecorder()
        self.refresh_s = refresh_s
        first = next(iter(self.replicas.values()), None)
        self.block_size = first.config.block_size if first is not None else 16
        self.mirror = ResidencyMirror(self.block_size)
        self._feeds: list[ResidencyFeed] | None = None  # subscribed at the first use
        self._hashes: dict[str, tuple[int, ...]] = {}
        self._sent: dict[str, int] = {}  # priority a turn is being submitted with
        self._pending: dict[str, tuple[QueuedTurn, str, int]] = {}  # rid -> (turn, replica, prio)
        self._timer = False
        self.num_updates = 0
        self.num_refreshes = 0

    @property
    def controls_at_submit(self) -> bool:
        return self.cache_aware is not None or self.guard is not None

    # -- what the harness knows -------------------------------------------------------------

    def waiting(self, q: QueuedTurn) -> WaitingRequest:
        h = self._hashes.get(q.request_id)
        if h is None:
            h = engine_hashes(q.num_prompt_tokens, q.block_hashes, q.block_size, self.block_size)
            self._hashes[q.request_id] = h
        return WaitingRequest(q.request_id, q.arrival_s, q.num_prompt_tokens, h,
                              role_of(q.session_id))  # fmt: skip

    def residency(self) -> ResidencyView:
        """The pool's residency now: the mirror after the KV events since the last look."""
        if self._feeds is None:
            self._feeds = [r.subscribe_residency() for r in self.replicas.values()]
        for i, feed in enumerate(self._feeds):
            self.mirror.apply(i, feed.drain())
        return self.mirror.view()

    def _priority(self, q: QueuedTurn, residency: ResidencyView) -> int:
        assert self.cache_aware is not None
        p = self.cache_aware.priority(self.waiting(q), residency)
        return DEFAULT_PRIORITY if p is None else p

    # -- the replay's hooks -------------------------------------------------------------------

    def controls(self, q: QueuedTurn) -> tuple[Control, ...]:
        """The controls a turn is submitted with."""
        out: list[Control] = []
        if self.guard is not None:
            out.append(self.guard.control())
        if self.cache_aware is not None:
            with self.recorder.measure(Op.KV_STATE_UPDATE):
                residency = self.residency()
            with self.recorder.measure(Op.SCHEDULING_DECISION):
                prio = self._priority(q, residency)
            self._sent[q.request_id] = prio
            out.append(Priority(prio))
        return tuple(out)

    def on_submit(self, q: QueuedTurn, replica: str) -> None:
        if self.cache_aware is None:
            return
        prio = self._sent.pop(q.request_id, DEFAULT_PRIORITY)
        self._pending[q.request_id] = (q, replica, prio)
        if not self._timer:
            self._timer = True
            clock = self.replicas[replica].clock
            clock.call_at(clock.now() + self.refresh_s, self._refresh, name="hear refresh")

    def on_complete(self, session: Session, turn: Turn, result: TurnResult) -> None:
        self._pending.pop(result.request_id, None)

    def _refresh(self) -> None:
        self._timer = False
        if not self._pending:
            return
        self.num_refreshes += 1
        with self.recorder.measure(Op.KV_STATE_UPDATE):
            residency = self.residency()
        with self.recorder.measure(Op.SCHEDULING_DECISION):
            for rid, (q, replica, old) in list(self._pending.items()):
                new = self._priority(q, residency)
                if new == old:
                    continue
                res = self.replicas[replica].update(rid, [Priority(new)])
                self.num_updates += 1
                if res.honoured:
                    self._pending[rid] = (q, replica, new)
                else:  # it already runs (or ended): its place in the queue is moot
                    del self._pending[rid]
        if self._pending:
            self._timer = True
            clock = next(iter(self.replicas.values())).clock
            clock.call_at(clock.now() + self.refresh_s, self._refresh, name="hear refresh")


class ContinuationHook:
    """Session-Aware as the replay's `on_complete` hook (module docstring).

    Args:
        policy: the Session-Aware policy.
        replicas: every replica a turn can run on (by name).
        recorder: where control-plane time goes.
        then: another `on_complete` hook to call afterwards.
    """

    def __init__(
        self,
        policy: SessionAware,
        replicas: Sequence[SimReplica],
        recorder: OverheadRecorder | None = None,
        then: Callable[[Session, Turn, TurnResult], None] | None = None,
    ) -> None:
        self.policy = policy
        self.replicas = {r.name: r for r in replicas}
        self.recorder = recorder if recorder is not None else OverheadRecorder()
        self.then = then
        self.views: dict[str, SessionView] = {}
        self._completed: list[SessionView] = []
        self._model = ContinuationModel((), None)
        self.num_intents = 0

    def __call__(self, session: Session, turn: Turn, result: TurnResult) -> None:
        with self.recorder.measure(Op.OUTCOME_REPORT):
            self._report(session, turn, result)
        if self.then is not None:
            self.then(session, turn, result)

    def _report(self, session: Session, turn: Turn, result: TurnResult) -> None:
        rep = self.replicas.get(result.replica)
        if rep is None:
            raise ConfigError(
                f"ContinuationHook: turn {result.request_id} ran on unknown replica "
                f"{result.replica!r}; pass every replica of the pool"
            )
        sid = session.session_id
        prev = self.views.get(sid)
        gaps = prev.gaps_s if prev is not None else ()
        if prev is not None and turn.turn_index > 0:
            gaps = (*gaps, max(0.0, result.arrival_s - prev.last_active_s))
        ended = result.status != "completed" or turn.turn_index == len(session.turns) - 1
        done = (prev.num_turns if prev is not None else 0) + (result.status == "completed")
        hashes = engine_hashes(turn.num_prompt_tokens, turn.prefix_block_hashes, turn.block_size,
                               rep.config.block_size)  # fmt: skip
        view = SessionView(sid, ContextRef(sid, turn.turn_index), hashes, done, result.finish_s,
                           ended, gaps)  # fmt: skip
        self.views[sid] = view
        # the forecast never uses the session's own future: it is told (open view) before the
        # conversation, if this was its last turn, joins the completed ones the model learns from
        rep.inform(self.policy.intent(dataclasses.replace(view, ended=False), self._model))
        self.num_intents += 1
        if ended:
            self._completed.append(view)
            self._model = ContinuationModel.fit(self._completed)


class ModeReplica:
    """A `SimReplica` proxy that sends each request's role's `ExecutionMode` (module docstring).

    Args:
        replica: the wrapped replica.
        selection: the role -> mode selection (None: submit without controls, all default).
        recorder: where mode-lookup time goes.
        records: the list receiving one `ModeRecord` per finished request.
    """

    def __init__(
        self,
        replica: SimReplica,
        selection: RoleModeSelection | None,
        recorder: OverheadRecorder,
        records: list[ModeRecord],
    ) -> None:
        self._replica = replica
        self.selection = selection
        self.recorder = recorder
        self.records = records

    def __getattr__(self, name: str) -> Any:
        return getattr(self._replica, name)

    def submit(self, request: Request, controls: Sequence[Control] = ()) -> Ticket:
        role = role_of(request.tags.get("session_id", ""))
        sel = self.selection
        if sel is None:
            return self._replica.submit(request, controls)
        with self.recorder.measure(Op.MODE_LOOKUP):
            control = sel.control(role)
        ticket = self._replica.submit(request, (*controls, control))
        version = sel.mapping.version
        rid = request.request_id

        def done(out: Outcome) -> None:
            realized = out.realized_mode or None
            self.records.append(ModeRecord(rid, role, control.mode, realized, version))

        ticket.on_done(done)
        return ticket
