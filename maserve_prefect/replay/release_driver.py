"""The replay's event logic: ops released under a release rule, on the run's clock.

One idea: replay keeps the work fixed and moves only release times. `ReleaseDriver` is plain
kernel callbacks on the run's clock (no threads, no Prefect task per op), one instance per replay:
each root starts at its arrival slot; an op is released when every release predecessor
(`trace.release.ReleasePlan`) has completed here, plus its recorded `external_delay_s`. A released
model op goes to `Dispatcher.on_ready` as a length-locked request (`replay.work`); any other op
completes after its recorded duration. Under Flat every op of a root is released at the root's
arrival (+ its external delay); under Arrival at the root's arrival plus the op's recorded
submission offset within its root (submitted, else ready time).

A root is done — its latency ends — when its final op completes if the root record names one
(`RootRecord.final_op_id`: the op that produced the answer), else when all its ops complete.
Straggler ops of a k-of-n join still run and are recorded; they no longer extend the root's
latency. The run is over when every root is done and every op, stragglers included, completed.

Cross-root edges that are not required (persistent-memory state reads) are relaxed: roots arrive
independently in a replay, so waiting on another root's op would couple arrivals the scenario set
apart. Required edges are always kept.

What happened to each op is kept as a `Realized` record, which `replay.audit` turns into the
replay trace; `replay.driver.replay_trace` builds the driver, schedules the roots and runs it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from maserve_prefect.clock import URGENT, Clock
from maserve_prefect.dispatch.dispatcher import Dispatcher
from maserve_prefect.dispatch.snapshot import Unit
from maserve_prefect.engines.poolfile import PoolFile
from maserve_prefect.errors import SimulationError, TraceValidationError
from maserve_prefect.protocol.engine import Replica
from maserve_prefect.protocol.outcomes import Outcome, OutcomeStatus
from maserve_prefect.replay.requests import op_submit_time
from maserve_prefect.replay.work import InputLock, deployment_of, model_request, op_duration
from maserve_prefect.trace.cas import BlobStore
from maserve_prefect.trace.model import OpKind, OpRecord, OpStatus, Trace
from maserve_prefect.trace.release import ReleaseRule, release_predecessors

__all__ = ["WAKE_LEAD_S", "Realized", "ReleaseDriver"]

WAKE_LEAD_S = 0.0015
"""How early a wall-clock arrival timer fires; the rest is waited out on the clock (see
`ReleaseDriver.schedule_root`)."""


@dataclass(slots=True)
class Realized:
    """What happened to one op in this replay (times on the replay's clock)."""

    ready_s: float | None = None
    submitted_s: float | None = None
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    completed_s: float | None = None
    num_input_tokens: int | None = None
    num_output_tokens: int | None = None
    num_cached_tokens: int = 0
    replica: str = ""
    status: OpStatus = OpStatus.INCOMPLETE
    error: str | None = None


class ReleaseDriver:
    """Event logic of one replay (see the module docstring); one instance per run."""

    def __init__(
        self,
        trace: Trace,
        store: BlobStore | None,
        rule: ReleaseRule,
        clock: Clock,
        replicas: Callable[[], Sequence[Replica]],
        pool_file: PoolFile,
        plan: str,
        lock: InputLock,
        *,
        wall: bool = False,
    ) -> None:
        self.trace, self.store, self.rule, self.lock = trace, store, rule, lock
        self.clock = clock
        self.wall = wall
        self.pool_file = pool_file
        self.dispatcher = Dispatcher(replicas, clock.now, plan)
        self.ops = trace.op_index()
        self.preds = _effective_predecessors(trace, rule)
        self.succs: dict[str, list[str]] = {op_id: [] for op_id in self.ops}
        for op_id, preds in self.preds.items():
            for p in preds:
                self.succs[p].append(op_id)
        self.waiting = {op_id: len(p) for op_id, p in self.preds.items()}
        self.by_root: dict[str, list[str]] = {}
        for op_id, op in self.ops.items():
            self.by_root.setdefault(op.root_id, []).append(op_id)
        self.recorded_arrival = {r.root_id: r.arrival_s for r in trace.roots}
        self.realized = {op_id: Realized() for op_id in self.ops}
        self.remaining = {root: len(ids) for root, ids in self.by_root.items()}
        self.num_open_ops = len(self.ops)
        self.final_op = _final_ops(trace, self.ops)
        self.arrival: dict[str, float] = {}
        self.finish: dict[str, float] = {}
        self.on_root_done: Any = None
        self.on_all_done: Any = None
        # Wall-clock instrumentation for the conformance audit: (perf_counter_ns, clock time).
        self.trigger: dict[str, tuple[int, float]] = {}
        self.wall_ns: dict[str, tuple[int, int]] = {}
        # Per released op: (the time its last release predecessor completed as the engine saw
        # it, the release time), both on the run's clock: the release lateness of wall runs.
        self.release_lag: dict[str, tuple[float, float]] = {}
        self.pred_done: dict[str, float] = {}
        # The schedule: per root its due arrival, per op released on it (a root's first ops) the
        # due release time; the audit compares it with when the request was sent.
        self.due_arrival: dict[str, float] = {}
        self.due_release: dict[str, float] = {}
        # Built up front so a bad op fails before the clock starts, naming the op.
        self.requests = {
            op_id: model_request(op, pool_file.resolve(deployment_of(op)), lock, store)
            for op_id, op in self.ops.items()
            if op.kind is OpKind.MODEL
        }

    # -- roots -----------------------------------------------------------------------------

    def schedule_root(self, root_id: str, t: float) -> None:
        """Let `root_id` arrive at `t` on the run's clock (its due arrival).

        On the wall clock the timer is set `WAKE_LEAD_S` early and the rest is waited out on
        the clock itself: the event loop's timers wake up to a millisecond late (epoll rounds
        its timeout up to whole milliseconds), which would be the schedule's lateness.
        """
        self.due_arrival[root_id] = t
        if not self.wall:
            self.clock.call_at(t, lambda: self._arrive(root_id), URGENT, f"arrival {root_id}")
            return

        def on_time() -> None:
            while self.clock.now() < t:  # at most WAKE_LEAD_S: a short spin, never a sleep
                pass
            self._arrive(root_id)

        self.clock.call_at(t - WAKE_LEAD_S, on_time, URGENT, f"arrival {root_id}")

    def _arrive(self, root_id: str) -> None:
        now = self.clock.now()
        self.arrival[root_id] = now
        self.dispatcher.on_arrival(root_id)
        if not self.remaining.get(root_id):
            self._root_done(root_id)
            return
        due = self.due_arrival.get(root_id, now)
        for op_id in self.by_root[root_id]:
            if self.waiting[op_id] == 0:
                self.trigger[op_id] = (time.perf_counter_ns(), now)
                self.pred_done[op_id] = now
                offset = self._first_offset(op_id)
                self.due_release[op_id] = due + offset
                if self.wall and offset <= 0.0:
                    self._release(op_id)  # due now: no second trip through the event loop
                else:
                    self._schedule_release(op_id, now + offset)

    def _first_offset(self, op_id: str) -> float:
        op = self.ops[op_id]
        if self.rule is not ReleaseRule.ARRIVAL:
            return op.external_delay_s
        base = self.recorded_arrival.get(op.root_id, 0.0)
        return max(op_submit_time(op, base) - base, 0.0)

    def _root_done(self, root_id: str) -> None:
        self.finish[root_id] = self.clock.now()
        if self.on_root_done is not None:
            self.on_root_done(root_id)
        self._check_all_done()

    def _check_all_done(self) -> None:
        """Every root done and every op (stragglers included) completed: the run is over."""
        if (
            self.on_all_done is not None
            and self.num_open_ops == 0
            and len(self.finish) == len(self.recorded_arrival)
        ):
            self.on_all_done()

    # -- ops -------------------------------------------------------------------------------

    def _schedule_release(self, op_id: str, t: float) -> None:
        self.clock.call_at(t, lambda: self._release(op_id), URGENT, f"release {op_id}")

    def _release(self, op_id: str) -> None:
        now = self.clock.now()
        trigger_ns, trigger_t = self.trigger.get(op_id, (time.perf_counter_ns(), now))
        if now > trigger_t:  # waited a delay on the virtual clock: react from the timer firing
            trigger_ns = time.perf_counter_ns()
        unfinished = [p for p in self.preds[op_id] if self.realized[p].completed_s is None]
        if unfinished:  # invariant: never release before the rule's predecessors completed
            raise SimulationError(f"op {op_id} released before {unfinished} completed")
        op, rec = self.ops[op_id], self.realized[op_id]
        rec.ready_s = now
        self.release_lag[op_id] = (self.pred_done.get(op_id, trigger_t), now)
        if op.kind is not OpKind.MODEL:
            rec.num_input_tokens, rec.num_output_tokens = op.num_input_tokens, op.num_output_tokens

            def finished() -> None:  # the recorded outcome, once the recorded duration is over
                rec.status = op.status
                self._complete(op_id)

            self.wall_ns[op_id] = (trigger_ns, time.perf_counter_ns())
            self.clock.call_at(now + op_duration(op), finished, URGENT)
            return
        request = self.requests[op_id]
        unit = Unit(
            unit_id=op_id,
            root_id=op.root_id,
            deployment=request.deployment,
            num_prompt_tokens=request.num_prompt(),
            max_tokens=request.max_tokens,
            priority=request.priority,
            ready_s=now,
            session_id=op.session_id,  # the `session` plan keeps a session on one replica
        )

        def submitted(t: float, replica: str) -> None:
            rec.submitted_s, rec.replica = t, replica

        def done(out: Outcome) -> None:
            if out.attempts:  # a real engine: submitted when its first attempt was sent
                rec.submitted_s = out.attempts[0].start_s
            rec.first_scheduled_s, rec.first_token_s = out.first_scheduled_s, out.first_token_s
            rec.num_input_tokens, rec.num_output_tokens = (
                out.num_prompt_tokens,
                out.num_output_tokens,
            )
            rec.num_cached_tokens = out.num_cached_tokens
            ok = out.status is OutcomeStatus.COMPLETED
            rec.status = OpStatus.COMPLETED if ok else OpStatus.FAILED
            rec.error = None if ok else (out.error or out.status.value)
            self._complete(op_id, out.finish_s)

        self.wall_ns[op_id] = (trigger_ns, time.perf_counter_ns())
        self.dispatcher.on_ready(unit, request, on_done=done, on_submitted=submitted)

    def schedule_lag(self) -> dict[str, tuple[float, float]]:
        """Per op released on the schedule (a root's first ops): (due release time, when it
        went out: its request's send for a model op, its release for any other), on the run's
        clock; ops never sent are left out."""
        out: dict[str, tuple[float, float]] = {}
        for op_id, due in self.due_release.items():
            rec = self.realized[op_id]
            went = rec.submitted_s if self.ops[op_id].kind is OpKind.MODEL else rec.ready_s
            if went is not None:
                out[op_id] = (due, went)
        return out

    def _complete(self, op_id: str, observed_s: float | None = None) -> None:
        """Op `op_id` completed: now on this clock; `observed_s` when the engine saw it end."""
        now = self.clock.now()
        self.realized[op_id].completed_s = now
        seen = now if observed_s is None else min(observed_s, now)
        for succ in self.succs[op_id]:
            self.waiting[succ] -= 1
            self.pred_done[succ] = max(self.pred_done.get(succ, seen), seen)
            if self.waiting[succ] == 0:
                self.trigger[succ] = (time.perf_counter_ns(), now)
                self._schedule_release(succ, now + self.ops[succ].external_delay_s)
        root = self.ops[op_id].root_id
        self.remaining[root] -= 1
        self.num_open_ops -= 1
        final = self.final_op.get(root)
        if op_id == final or (final is None and self.remaining[root] == 0):
            self._root_done(root)
        else:
            self._check_all_done()


def _final_ops(trace: Trace, ops: Mapping[str, OpRecord]) -> dict[str, str]:
    """Root id → its final op id, for the roots that name one.

    Raises:
        TraceValidationError: a root names a final op that is not one of its ops.
    """
    out: dict[str, str] = {}
    for root in trace.roots:
        final = root.final_op_id
        if final is None:
            continue
        op = ops.get(final)
        if op is None or op.root_id != root.root_id:
            raise TraceValidationError(
                f"root {root.root_id!r} names final op {final!r}, which is not an op of that "
                "root in the replayed trace; fix the root's final_op_id or keep the op in the set"
            )
        out[root.root_id] = final
    return out


def _effective_predecessors(trace: Trace, rule: ReleaseRule) -> dict[str, tuple[str, ...]]:
    """The rule's predecessors minus relaxed cross-root, non-required edges."""
    index = trace.op_index()
    preds = release_predecessors(trace, rule)
    out: dict[str, tuple[str, ...]] = {}
    for op_id, ps in preds.items():
        op = index[op_id]
        required = {d.op_id for d in op.deps if d.required}
        out[op_id] = tuple(
            p for p in ps if p in index and (index[p].root_id == op.root_id or p in required)
        )
    return out
