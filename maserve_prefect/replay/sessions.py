"""Replay a `SessionSet` on simulated replicas, each turn sent to the engine as it arrives.

One idea: a turn goes to the engine as soon as it arrives, with the controls the harness attaches
(`controls(turn)`: HEAR's priorities and waiting requirements), and the engine's own admission
— KV room, `max_num_seqs`, the token budget, its scheduling policy — decides what runs. Only
when the caller caps the requests a replica holds (`max_in_flight`, an agent framework's
concurrency limit; off by default) do turns wait in front of the replicas, and then the *ordering
hook* `order(waiting, now_s) -> [request_id, ...]` picks which waiting turns are submitted, in
that order (ids it leaves out stay queued; an id that is not waiting, or appears twice, is an
error). `on_submit(turn, replica)` tells the caller where a turn went.

Timing:

- open loop (`mode="open"`): each turn arrives at its recorded `arrival_s`, shifted so the
  earliest turn lands at `start_s` (default: the clock's now);
- closed loop (`mode="closed"`): a session's first turn arrives at its (shifted) `arrival_s`;
  each later turn arrives `think_s` after the previous turn *completed*. A closed-loop turn that is
  rejected or fails ends its session (the next prompt would hold an answer that never came); the
  remaining turns are counted as skipped. Open-loop turns arrive regardless.

The queue is the one `Dispatcher`'s (`dispatch`): each arriving turn is a ready unit, the
replicas' caps are the dispatcher's `max_outstanding`, and the plan is `sticky` (or `ordered`
with `sticky=False`, `dispatch.admission`) with the hook as its order. It plans once per instant
at which something arrived or finished (a NORMAL-priority kernel event, after the instant's
arrivals and step ends, before the replicas' next step starts), so same-instant arrivals are
ordered together. A session's turns go to the replica that served its first turn (`sticky=True`,
default — the only place its prefix is cached); a first turn goes to the replica with room that
has the fewest outstanding requests (ties by name).

Results (`replay.session_results`): per turn, per session and the aggregates; TTFT is measured
from the harness arrival. Everything runs on the kernel's virtual time and is deterministic for a
given set, pool and hooks.

The hook sees `QueuedTurn`s; `QueuedTurn.to_waiting()` gives the `protocol.views.WaitingRequest` a
HEAR policy orders, so a policy plugs in as
`order=lambda w, now: policy.order([q.to_waiting() for q in w], residency(), now)`.

Examples:
    >>> from maserve_prefect.clock.kernel import Kernel
    >>> from maserve_prefect.engines.sim.pool.sim_pool import Deployment, SimPool
    >>> from maserve_prefect.workloads.scbench import generate_scbench
    >>> k = Kernel(); pool = SimPool(k, ["H100:0"])
    >>> _ = pool.load(Deployment("q", "Qwen3-0.6B"), "H100:0"); k.run()
    >>> sset = generate_scbench(2, seed=0, context_tokens=(512, 512), max_turns=2, min_turns=2,
    ...                         mean_turns=2)
    >>> res = replay_sessions(sset, pool, deployment="q")
    >>> res.status_counts(), res.reuse > 0
    ({'completed': 4}, True)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from maserve_prefect.clock import NORMAL, URGENT
from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.dispatch.books import PlainBooks, per_instant
from maserve_prefect.dispatch.dispatcher import Dispatcher
from maserve_prefect.dispatch.plans import get_plan
from maserve_prefect.dispatch.snapshot import Unit
from maserve_prefect.engines.sim.pool.sim_pool import SimPool
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.errors import ConfigError, SimulationError
from maserve_prefect.protocol.controls import Control
from maserve_prefect.protocol.outcomes import Outcome, OutcomeStatus
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.views import WaitingRequest
from maserve_prefect.replay.session_results import SessionReplayResult, SessionResult, TurnResult
from maserve_prefect.workloads.sessions import Session, SessionSet, Turn

__all__ = [
    "CompleteHook",
    "ControlHook",
    "OrderHook",
    "QueuedTurn",
    "SubmitHook",
    "replay_sessions",
]


@dataclass(frozen=True, slots=True)
class QueuedTurn:
    """A turn waiting in the admission queue (what the ordering hook sees).

    Attributes:
        request_id: `"<session_id>/t<turn_index>"`.
        arrival_s: when it entered the queue.
        block_hashes: its prompt's prefix-block hashes (`block_size` tokens each).
    """

    request_id: str
    session_id: str
    turn_index: int
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    block_hashes: tuple[int, ...]
    block_size: int
    role: str = ""
    max_wait_s: float | None = None

    def wait_s(self, now_s: float) -> float:
        return now_s - self.arrival_s

    def to_waiting(self) -> WaitingRequest:
        """The HEAR view of this turn (for `hear.policies` ordering policies)."""
        return WaitingRequest(
            self.request_id,
            self.arrival_s,
            self.num_prompt_tokens,
            self.block_hashes,
            self.role,
            self.max_wait_s,
        )


OrderHook = Callable[[Sequence[QueuedTurn], float], Sequence[str]]
CompleteHook = Callable[[Session, Turn, TurnResult], None]
ControlHook = Callable[[QueuedTurn], Sequence[Control]]
"""The controls a turn is submitted with (HEAR priorities, waiting requirements)."""
SubmitHook = Callable[[QueuedTurn, str], None]
"""Told when a turn is handed to a replica (by name)."""


def _target_replicas(target: SimPool | Sequence[SimReplica], deployment: str) -> list[SimReplica]:
    if isinstance(target, SimPool):
        return target.ready_replicas(deployment)
    reps = list(target)
    if not reps:
        raise ConfigError("replay_sessions needs at least one replica")
    if len({r.name for r in reps}) != len(reps):
        raise ConfigError(f"replica names must be unique, got {[r.name for r in reps]}")
    return reps


class _Replay:
    """The driver's state for one run (see the module docstring)."""

    def __init__(
        self,
        sset: SessionSet,
        replicas: list[SimReplica],
        clock: Kernel,
        deployment: str,
        order: OrderHook | None,
        on_complete: CompleteHook | None,
        max_in_flight: int | None,
        sticky: bool,
        controls: ControlHook | None = None,
        on_submit: SubmitHook | None = None,
    ) -> None:
        self.sset = sset
        self.clock = clock
        self.deployment = deployment
        self.on_complete = on_complete
        caps = {} if max_in_flight is None else {r.name: max_in_flight for r in replicas}
        self.controls = controls
        self.on_submit = on_submit
        hook = None if order is None else partial(self._order, order)
        self.dispatcher = Dispatcher(
            lambda: replicas,
            clock.now,
            get_plan("sticky" if sticky else "ordered", order=hook),
            books=PlainBooks(per_instant(clock, NORMAL)),
            max_outstanding=caps,
        )
        self.waiting: dict[str, QueuedTurn] = {}  # in the admission queue, by request id
        self.submitted: dict[str, tuple[float, str]] = {}  # request id -> (submit time, replica)
        self.results: list[TurnResult] = []
        self.submit_order: list[str] = []
        self.skipped: Counter[str] = Counter()
        self.num_open = sum(len(s.turns) for s in sset)  # turns not yet finished or skipped

    def _order(self, hook: OrderHook, ready: Sequence[Unit], now_s: float) -> Sequence[str]:
        """The caller's hook over the waiting turns, in the order they entered the queue."""
        return hook([self.waiting[u.unit_id] for u in ready], now_s)

    # -- arrivals ---------------------------------------------------------------------------

    def schedule(self, start_s: float) -> None:
        closed = self.sset.mode == "closed"
        firsts = [s.turns[0].arrival_s for s in self.sset]
        allt = firsts if closed else [t.arrival_s for s in self.sset for t in s.turns]
        t0 = min(t for t in allt if t is not None)
        for s in self.sset:
            for t in s.turns[:1] if closed else s.turns:
                assert t.arrival_s is not None  # SessionSet checked the mode's times
                at = start_s + (t.arrival_s - t0)
                self.clock.call_at(at, partial(self.arrive, s, t), URGENT, "session arrival")

    def arrive(self, s: Session, t: Turn) -> None:
        """A turn enters the admission queue: the dispatcher holds it until the plan admits it."""
        rid = s.request_id(t.turn_index)
        now = self.clock.now()
        q = QueuedTurn(
            rid,
            s.session_id,
            t.turn_index,
            now,
            t.num_prompt_tokens,
            t.num_output_tokens,
            t.prefix_block_hashes,
            t.block_size,
        )
        req = Request(
            rid,
            self.deployment,
            num_prompt_tokens=t.num_prompt_tokens,
            prefix_block_hashes=t.prefix_block_hashes,
            prefix_block_size=t.block_size if t.prefix_block_hashes else 0,
            max_tokens=t.num_output_tokens,
            min_tokens=t.num_output_tokens,
            tags={"session_id": s.session_id, "turn_index": str(t.turn_index)},
        )
        self.waiting[rid] = q
        unit = Unit(rid, s.session_id, self.deployment, t.num_prompt_tokens,
                    t.num_output_tokens, ready_s=now)  # fmt: skip
        extra = tuple(self.controls(q)) if self.controls is not None else ()
        self.dispatcher.on_ready(
            unit,
            req,
            controls=extra,
            on_done=partial(self.done, s, t, q),
            on_submitted=partial(self.on_submitted, q),
        )

    def on_submitted(self, q: QueuedTurn, now: float, replica: str) -> None:
        self.submit_order.append(q.request_id)
        self.submitted[q.request_id] = (now, replica)
        if self.on_submit is not None:
            self.on_submit(q, replica)

    # -- completion -------------------------------------------------------------------------

    def done(self, s: Session, t: Turn, q: QueuedTurn, out: Outcome) -> None:
        del self.waiting[q.request_id]
        submit_s, replica = self.submitted.get(q.request_id, (out.finish_s, ""))
        if out.status is OutcomeStatus.REJECTED:
            res = TurnResult(
                s.session_id, t.turn_index, q.request_id, replica, "rejected", out.error or "",
                q.arrival_s, submit_s, None, submit_s, t.num_prompt_tokens, 0, 0, 0,
            )  # fmt: skip
        else:
            ok = out.status is OutcomeStatus.COMPLETED and out.first_token_s is not None
            res = TurnResult(
                s.session_id, t.turn_index, q.request_id, replica,
                "completed" if ok else "failed", out.error or "", q.arrival_s, submit_s,
                out.first_token_s, out.finish_s, out.num_prompt_tokens, out.num_output_tokens,
                out.num_cached_tokens, out.num_preemptions, out.first_scheduled_s,
            )  # fmt: skip
        self.finish(s, t, res)

    def finish(self, s: Session, t: Turn, res: TurnResult) -> None:
        self.results.append(res)
        self.num_open -= 1
        if self.on_complete is not None:
            self.on_complete(s, t, res)
        if self.sset.mode != "closed":
            return
        rest = len(s.turns) - t.turn_index - 1
        if res.status != "completed":
            self.skipped[s.session_id] += rest
            self.num_open -= rest
        elif rest:
            nxt = s.turns[t.turn_index + 1]
            assert nxt.think_s is not None  # SessionSet checked the mode's times
            at = max(res.finish_s, self.clock.now()) + nxt.think_s
            self.clock.call_at(at, partial(self.arrive, s, nxt), URGENT, "session think")

    # -- run --------------------------------------------------------------------------------

    def run(self) -> None:
        clock = self.clock
        while self.num_open > 0:
            if math.isinf(clock.peek()):
                raise SimulationError(
                    f"session replay stuck: {self.num_open} turns unfinished, "
                    f"{len(self.waiting)} waiting in the admission queue and no event pending "
                    "(does the ordering hook hold every waiting turn back?)"
                )
            try:
                clock.step()
            except SimulationError as exc:
                # the kernel wraps callback errors; a bad hook answer is the caller's config
                if isinstance(exc.__cause__, ConfigError):
                    raise exc.__cause__ from None
                raise

    def result(self, start_s: float) -> SessionReplayResult:
        by_session: dict[str, list[TurnResult]] = {}
        for r in self.results:
            by_session.setdefault(r.session_id, []).append(r)
        sessions = []
        for s in self.sset:
            rs = by_session.get(s.session_id, [])
            sessions.append(
                SessionResult(
                    s.session_id,
                    min((r.arrival_s for r in rs), default=start_s),
                    max((r.finish_s for r in rs), default=start_s),
                    len(s.turns),
                    sum(r.status == "completed" for r in rs),
                    self.skipped[s.session_id],
                    sum(r.e2e_s for r in rs if r.status == "completed"),
                )
            )
        turns = sorted(self.results, key=lambda r: (r.session_id, r.turn_index))
        end = max((r.finish_s for r in turns), default=start_s)
        return SessionReplayResult(
            self.sset.content_hash(), self.sset.mode, start_s, end, turns, sessions,
            list(self.submit_order),
        )  # fmt: skip


def replay_sessions(
    sset: SessionSet,
    target: SimPool | Sequence[SimReplica],
    *,
    deployment: str = "",
    order: OrderHook | None = None,
    on_complete: CompleteHook | None = None,
    max_in_flight: int | None = None,
    sticky: bool = True,
    start_s: float | None = None,
    controls: ControlHook | None = None,
    on_submit: SubmitHook | None = None,
) -> SessionReplayResult:
    """Run every session of `sset` to its end on `target` (see the module docstring).

    Args:
        sset: the recorded workload.
        target: a `SimPool` (its READY replicas of `deployment`) or `SimReplica`s on one kernel.
        deployment: the deployment name requests address ("" for bare replicas that accept any).
        order: the admission-queue ordering hook (default: first come, first served).
        on_complete: called as `on_complete(session, turn, result)` when a turn ends (any
            status), before a closed-loop session's next turn is scheduled.
        max_in_flight: a cap on this driver's requests inside each replica (default: none —
            every turn is submitted when it arrives and the engine's admission decides).
        sticky: keep a session's turns on the replica that served its first turn.
        start_s: where the earliest arrival lands (default: the clock's now).
        controls: the controls each turn is submitted with (default: none).
        on_submit: called as `on_submit(turn, replica_name)` when a turn is handed to a replica.

    Raises:
        ConfigError: no usable replica, `max_in_flight < 1`, or the hook returned bad ids.
        SimulationError: nothing left to happen while turns are unfinished.
    """
    if max_in_flight is not None and max_in_flight < 1:
        raise ConfigError(f"max_in_flight must be >= 1, got {max_in_flight}")
    if not len(sset):
        raise ConfigError("the session set is empty; nothing to replay")
    replicas = _target_replicas(target, deployment)
    clock = replicas[0].clock
    if not isinstance(clock, Kernel):
        raise ConfigError("session replay needs replicas on a virtual-time Kernel")
    if any(r.clock is not clock for r in replicas):
        raise ConfigError("all replicas must share one kernel")
    start = clock.now() if start_s is None else start_s
    replay = _Replay(sset, replicas, clock, deployment, order, on_complete, max_in_flight, sticky,
                     controls, on_submit)  # fmt: skip
    replay.schedule(start)
    replay.run()
    return replay.result(start)
