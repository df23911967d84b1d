"""Glue between HEAR policies (`hear/`) and the session-replay driver (`workloads/`).

One idea: a HEAR policy is pure and knows nothing of the simulator, and the replay driver knows
nothing of HEAR; these adapters translate, and time every translation as control-plane overhead
(`hear.overhead.OverheadRecorder`), so the cost of the protocol is measured where it is paid.
`bench.hear.arms` wires them onto one replay per policy arm.

- `PolicyOrder` — the driver's `order` hook from an ordering policy. At each dispatch it brings
  its `ResidencyMirror` up to date from every replica's KV events (`SimReplica
  .subscribe_residency()`, one `KV_STATE_UPDATE`: the changes since the last dispatch, not a
  photograph of the pool) — one `ResidencyView` over all replicas (a block resident on any
  replica counts; the faster tier wins — the hook does not know where a first turn will be
  placed) — turns the queued turns into `WaitingRequest`s with the *engine's* block hashes
  (`engines.sim.hear.side.prompt_block_hashes`, memoized per request, since the session file's
  hashes are the workload's, not the engine's) and calls `policy.order` (one `SCHEDULING_DECISION`).
  Re-check: before an older order's waiting requests run, `policy.recheck` is asked, under the
  new residency, whether each request the previous order ranked hot still is; a False is
  counted (`num_recheck_demoted`) and the request is ordered again with the current residency —
  which the hook does anyway, since it orders afresh at every dispatch. Policies that read no
  residency (FCFS, Guard alone) skip the photograph.
- `RetentionHook` — Session-Aware retention as the driver's `on_complete` hook. It keeps one
  `SessionView` per session (turns completed, last finish, ended after its last turn — the
  moment a harness learns a conversation is closed), fits `ContinuationEstimator` from *ended*
  sessions only, and sends `CacheRetain` / `CacheRelease` controls to the replica that served
  the turn through `SimReplica.control()` (one `OUTCOME_REPORT`): the completing session's
  control every time, and a release once for each other session on that replica that ended or
  decayed under `release_below` since its last control.
- `ModeReplica` — a replica proxy that sends each request's `ExecutionMode` (from
  `RoleModeSelection`, one `MODE_LOOKUP`) with `submit` and records requested vs realized mode
  (`hear.modemap.ModeRecord`) from the outcome. The replay driver submits without controls, so
  the proxy is how controls reach the engine without changing `workloads/`.

Examples:
    >>> from maserve_prefect.hear.policies import Fcfs
    >>> hook = PolicyOrder(Fcfs(), [])
    >>> hook([], 0.0)
    []
"""

from __future__ import annotations

import bisect
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
    Composed,
    ContinuationEstimator,
    OrderingPolicy,
    RoleModeSelection,
    SessionRetention,
)
from maserve_prefect.protocol.controls import CacheRelease, CacheRetain, Control, Tier
from maserve_prefect.protocol.outcomes import Outcome, Ticket
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.state import ResidencyView
from maserve_prefect.protocol.subjects import ContextRef
from maserve_prefect.protocol.views import SessionView, WaitingRequest, fcfs_order
from maserve_prefect.replay.session_results import TurnResult
from maserve_prefect.replay.sessions import QueuedTurn
from maserve_prefect.workloads.sessions import Session, Turn

__all__ = [
    "ModeReplica",
    "PolicyOrder",
    "RetentionHook",
    "engine_hashes",
    "merged_residency",
    "role_of",
]


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


def merged_residency(
    replicas: Sequence[SimReplica], needed: set[int] | None = None
) -> ResidencyView:
    """One view over every replica's state report (the faster tier wins for a shared block).

    With `needed`, each replica is asked about only those hashes (the waiting requests'
    blocks; `SimReplica.hear_state(hashes)`): the policies ask about nothing else, so their
    decisions are the same, and a pool with ~10^5 resident blocks per replica is neither
    listed nor copied at every dispatch.
    """
    tiers: dict[int, Tier] = {}
    block_size = 16
    for rep in replicas:
        report = rep.hear_state(needed)
        block_size = report.block_size
        for rng in report.residency:
            for h in rng.block_hashes:
                old = tiers.get(h)
                if old is None or rng.tier < old:
                    tiers[h] = rng.tier
    return ResidencyView.of(tiers, block_size)


def _reads_residency(policy: OrderingPolicy) -> bool:
    if isinstance(policy, Composed):
        return any(_reads_residency(p) for p in policy.policies)
    return isinstance(policy, CacheAware)


class PolicyOrder:
    """The replay driver's `order` hook from a HEAR ordering policy (module docstring).

    Args:
        policy: the ordering policy (`Fcfs`, `CacheAware`, `compose(...)`, ...).
        replicas: the replicas whose residency the policy reads.
        recorder: where control-plane time goes (a fresh one by default).
    """

    def __init__(
        self,
        policy: OrderingPolicy,
        replicas: Sequence[SimReplica],
        recorder: OverheadRecorder | None = None,
        max_in_flight: int | None = None,
    ) -> None:
        self.policy = policy
        self.max_in_flight = max_in_flight
        self.replicas = list(replicas)
        self.recorder = recorder if recorder is not None else OverheadRecorder()
        self.reads_residency = _reads_residency(policy)
        self.block_size = self.replicas[0].config.block_size if self.replicas else 16
        self.mirror = ResidencyMirror(self.block_size)
        self._feeds: list[ResidencyFeed] | None = None  # subscribed at the first order
        self._hashes: dict[str, tuple[int, ...]] = {}
        self._hot: set[str] = set()  # ranked hot by the previous order
        self.num_orders = 0
        self.num_recheck_demoted = 0
        self.max_wait_seen_s = 0.0

    def waiting(self, q: QueuedTurn) -> WaitingRequest:
        h = self._hashes.get(q.request_id)
        if h is None:
            h = engine_hashes(q.num_prompt_tokens, q.block_hashes, q.block_size, self.block_size)
            self._hashes[q.request_id] = h
        return WaitingRequest(q.request_id, q.arrival_s, q.num_prompt_tokens, h,
                              role_of(q.session_id), q.max_wait_s)  # fmt: skip

    def residency(self) -> ResidencyView:
        """The pool's residency now: the mirror after this dispatch's KV events."""
        if self._feeds is None:
            self._feeds = [r.subscribe_residency() for r in self.replicas]
        for i, feed in enumerate(self._feeds):
            self.mirror.apply(i, feed.drain())
        return self.mirror.view()

    def _room(self) -> int:
        cap = self.max_in_flight or 0
        return sum(max(0, cap - r.num_outstanding) for r in self.replicas)

    def __call__(self, queued: Sequence[QueuedTurn], now_s: float) -> list[str]:
        if not queued:
            return []
        rec = self.recorder
        if self.max_in_flight is not None and len(queued) <= self._room():
            # every waiting turn is submitted now whatever the order: skip the photograph
            return [
                q.request_id
                for q in fcfs_order(queued, lambda q: q.arrival_s, lambda q: q.request_id)
            ]
        if self.reads_residency:
            with rec.measure(Op.KV_STATE_UPDATE):
                residency = self.residency()
        else:
            residency = ResidencyView.of({}, self.block_size)
        with rec.measure(Op.SCHEDULING_DECISION):
            views = [self.waiting(q) for q in queued]
            if self._hot:
                for w in views:
                    if w.request_id in self._hot and not self.policy.recheck(w, residency):
                        self.num_recheck_demoted += 1
            ranked = self.policy.order(views, residency, now_s)
            if self.reads_residency:
                self._hot = {w.request_id for w in views if _is_hot(self.policy, w, residency)}
        self.num_orders += 1
        self.max_wait_seen_s = max(self.max_wait_seen_s, max(now_s - q.arrival_s for q in queued))
        return ranked


def _is_hot(policy: OrderingPolicy, w: WaitingRequest, residency: ResidencyView) -> bool:
    if isinstance(policy, CacheAware):
        return policy.is_hot(w, residency)
    if isinstance(policy, Composed):
        return any(_is_hot(p, w, residency) for p in policy.policies)
    return False


class RetentionHook:
    """Session-Aware retention as the replay driver's `on_complete` hook (module docstring).

    Args:
        policy: the retention policy.
        replicas: every replica a turn can run on (by name).
        recorder: where control-plane time goes.
        then: another `on_complete` hook to call afterwards.
    """

    def __init__(
        self,
        policy: SessionRetention,
        replicas: Sequence[SimReplica],
        recorder: OverheadRecorder | None = None,
        then: Callable[[Session, Turn, TurnResult], None] | None = None,
    ) -> None:
        self.policy = policy
        self.replicas = {r.name: r for r in replicas}
        self.recorder = recorder if recorder is not None else OverheadRecorder()
        self.then = then
        self.views: dict[str, SessionView] = {}
        self.home: dict[str, str] = {}
        # turn counts of the ended sessions, sorted as they end: the estimator's only input
        self._ended_turns: list[int] = []
        # open sessions per replica, in the order they were first seen (the release loop's
        # order): a session leaves when it ends, so the loop is as long as what is open
        self._open: dict[str, dict[str, None]] = {}
        self.released: set[str] = set()
        self.num_retains = 0
        self.num_releases = 0
        self.num_honoured = 0
        self._hashes: dict[str, tuple[int, ...]] = {}

    def estimator(self) -> ContinuationEstimator:
        """The continuation estimate from ended sessions only (what `ContinuationEstimator
        .from_sessions` gives for them, kept sorted as sessions end instead of re-sorted)."""
        return ContinuationEstimator(tuple(self._ended_turns))

    def __call__(self, session: Session, turn: Turn, result: TurnResult) -> None:
        with self.recorder.measure(Op.OUTCOME_REPORT):
            self._report(session, turn, result)
        if self.then is not None:
            self.then(session, turn, result)

    def _report(self, session: Session, turn: Turn, result: TurnResult) -> None:
        rep = self.replicas.get(result.replica)
        if rep is None:
            raise ConfigError(
                f"RetentionHook: turn {result.request_id} ran on unknown replica "
                f"{result.replica!r}; pass every replica of the pool"
            )
        sid = session.session_id
        ended = result.status != "completed" or turn.turn_index == len(session.turns) - 1
        prev = self.views.get(sid)
        done = (prev.num_turns if prev is not None else 0) + (result.status == "completed")
        hashes = engine_hashes(turn.num_prompt_tokens, turn.prefix_block_hashes, turn.block_size,
                               rep.config.block_size)  # fmt: skip
        view = SessionView(sid, ContextRef(sid, turn.turn_index), hashes, done,
                           result.finish_s, ended)  # fmt: skip
        self.views[sid] = view
        self.home[sid] = rep.name
        open_here = self._open.setdefault(rep.name, {})
        if ended:
            bisect.insort(self._ended_turns, view.num_turns)
            open_here.pop(sid, None)
        else:
            open_here.setdefault(sid, None)
        now = result.finish_s
        est = self.estimator()
        controls: list[Control] = list(self.policy.controls([view], now, estimator=est))
        # other open sessions on this replica that decayed under the threshold: release once
        for other_id in open_here:
            if other_id == sid or other_id in self.released:
                continue
            other = self.views[other_id]
            if self.policy.retention_priority(other, est, now) < self.policy.release_below:
                controls.append(CacheRelease(other.context, other.block_hashes))
                self.released.add(other_id)
        for c in controls:
            if isinstance(c, CacheRetain):
                self.num_retains += 1
                self.released.discard(sid)
            else:
                self.num_releases += 1
        if controls:
            res = rep.control(controls)
            self.num_honoured += len(res.honoured)


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
